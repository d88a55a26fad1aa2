"""The setting fingerprint every evaluation report carries: what must be equal for two numbers to be
compared — the model's weights, the corpus, the index and its encoder, the retriever's search settings,
passages per search, the prompt template, the turn and token limits, the decoding and the metric set —
and one digest over all of it (`id`), so two reports with the same id were measured the same way.

Pure apart from `model_fingerprint`, which reads the model directory: the small files (config, tokenizer,
chat template, generation config) whole and each weight file's size and first and last MiB (a quick
fingerprint like the retriever's corpus check, not a full digest: reading a 7B checkpoint whole for every
evaluation would cost more than the check is worth). Paths are recorded but left out of the digest, so a
copied model or corpus keeps its id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
SAMPLE_BYTES = 1 << 20


def _quick_digest(path: Path) -> str:
    """sha256 of a file's size and its first and last MiB."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(SAMPLE_BYTES))
        if size > 2 * SAMPLE_BYTES:
            f.seek(size - SAMPLE_BYTES)
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def model_fingerprint(model_dir: str | Path) -> dict[str, Any]:
    """`{"path", "sha256"}` of a model directory: one digest over every file's name and content (small
    files whole, weight files by `_quick_digest`). Blocking file I/O: async callers use a thread."""
    root = Path(model_dir)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        if rel.startswith(".") or rel in ("README.md", "eval.json"):
            continue
        digest = _quick_digest(f) if f.suffix in WEIGHT_SUFFIXES else hashlib.sha256(f.read_bytes()).hexdigest()
        h.update(f"{rel}\0{digest}\n".encode())
    return {"path": str(root), "sha256": h.hexdigest()}


def template_digest(template_text: str) -> str:
    return hashlib.sha256(template_text.encode()).hexdigest()


def setting_fingerprint(*, model: Mapping[str, Any], retriever: Mapping[str, Any], top_k: int, template: str,
                        template_sha256: str, limits: Mapping[str, Any], decoding: Mapping[str, Any],
                        metrics: Mapping[str, str]) -> dict[str, Any]:
    """The fingerprint document: its parts, and `id`, the sha256 of their canonical JSON without paths."""
    doc: dict[str, Any] = {
        "model": dict(model), "retriever": dict(retriever), "top_k": top_k,
        "prompt_template": {"name": template, "sha256": template_sha256},
        "limits": dict(limits), "decoding": dict(decoding), "metrics": dict(metrics),
    }
    doc["id"] = fingerprint_id(doc)
    return doc


def _without_paths(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_paths(v) for k, v in value.items() if k not in ("path", "id", "addresses")}
    if isinstance(value, list):
        return [_without_paths(v) for v in value]
    return value


def fingerprint_id(doc: Mapping[str, Any]) -> str:
    """sha256 of the fingerprint's canonical JSON, paths and addresses left out (16 hex digits shown)."""
    canonical = json.dumps(_without_paths(doc), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the parts where two fingerprints differ (paths and ids ignored)."""
    a, b = _without_paths(a), _without_paths(b)
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out += differences(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(prefix + key)
    return out
