"""`searchr1 weights export`: a trained run's snapshot as a Hugging Face model folder that transformers
(`AutoModelForCausalLM.from_pretrained`) and vLLM (`LLM(model=…)`) load as it is, with a model card; and
its upload to the Hub (`push_folder`).

A full snapshot (`RUN_DIR/weights/v########/`) holds what the learner publishes: config.json,
generation_config.json, model.safetensors and the manifest of its chunk digests; a version published as a
delta (`d########/`) is rebuilt into one first (`weightsync.materialize`). The folder adds what a
user needs to run it: the base model's tokenizer files and chat template (the learner trains the policy on
the base model's tokenizer and never changes it), the weights in the dtype asked for, and README.md — the
model card: how to prompt it (Search-R1's template, the stop strings `</search>`/`</answer>`, the
`<information>` format), the run's figures (the learner's last step, the validation curve, the
evaluations in the run directory), the setting fingerprint of those evaluations and the digests of what
was exported. The snapshot is verified first (its files against its manifest), so a torn or edited
snapshot is refused, not exported.

Departure from the usual `save_pretrained` folder: the weights stay one `model.safetensors` (the learner's
layout; transformers and vLLM load an unsharded checkpoint), and generation_config.json carries no
`stop_strings` (transformers' `generate` refuses them without a tokenizer argument); the card says how to
stop a turn instead.

What this module does not do: train, evaluate, or read Redis.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.weightsync import MANIFEST, WEIGHTS_FILE, manifest_digest, snapshot_digest

AS_PUBLISHED = "auto"
"""The export dtype that keeps the snapshot's (the engine's, as the learner published it)."""
DTYPES = (AS_PUBLISHED, "float32", "bfloat16", "float16")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
"""What the folder takes from the base model: the tokenizer and its chat template (never weights)."""
STEP_FIGURES = ("reward_mean", "em_mean", "searches_per_trajectory", "response_length_mean", "entropy", "kl_loss")


class ExportError(ValueError):
    """A run, snapshot or base model the export cannot use; the message says which and why."""


@dataclass
class ExportResult:
    out: Path
    version: int
    snapshot_digest: str
    weights_sha256: str
    dtype: str
    rebuilt: bool = False
    """The version was published as a delta and rebuilt from the newest full before it."""
    files: list[str] = field(default_factory=list)


def _versions(directory: Path) -> set[int]:
    """Versions with a directory under `directory`, full (`v########`) or delta (`d########`)."""
    out = set()
    for p in directory.iterdir() if directory.is_dir() else ():
        if p.is_dir() and p.name[:1] in ("v", "d") and p.name[1:].isdigit():
            out.add(int(p.name[1:]))
    return out


def snapshots_dir(run: Path) -> Path:
    """Where a run keeps its published versions: RUN/weights (as `searchr1 up` lays it out), or RUN itself."""
    for d in (run / "weights", run):
        if _versions(d):
            return d
    raise ExportError(f"no published versions (v########/ or d########/ directories) in {run / 'weights'} or {run}")


def pick_snapshot(run: Path, version: int | None) -> tuple[int, Path, bool]:
    """(version, its full snapshot directory, whether it was rebuilt) for `version` (default: the newest on
    disk, full or delta). A version published as a delta is rebuilt as a full snapshot beside the others
    (`weightsync.materialize`: the newest full before it and each delta after, every one read verified
    against its own manifest and applied with its checksums checked)."""
    from searchr1.weightsync import SnapshotError, materialize, newest_version

    root = snapshots_dir(run)
    on_disk = _versions(root)
    version = newest_version(root) if version is None else version
    if version is None or version not in on_disk:
        raise ExportError(f"no published version {version} in {root}; there are {sorted(on_disk)}")
    rebuilt = not (root / f"v{version:08d}" / WEIGHTS_FILE).is_file()
    try:
        snapshot = materialize(root, version)
    except (SnapshotError, ValueError, OSError) as exc:
        raise ExportError(f"version {version} in {root} cannot be rebuilt from its full version and deltas: "
                          f"{exc}") from None
    if snapshot is None:
        raise ExportError(f"no published version in {root}")
    return version, snapshot, rebuilt


def verify_snapshot(snapshot: Path, rebuilt: bool = False) -> str:
    """The snapshot's digest after checking every file against its manifest (ExportError when they differ,
    or when a published one has no manifest). A rebuilt one was verified piece by piece as it was rebuilt:
    its digest is computed from its files."""
    if rebuilt:
        return snapshot_digest(snapshot)
    stored = snapshot / MANIFEST
    if not stored.is_file():
        raise ExportError(f"{snapshot} has no {MANIFEST}: not a snapshot the learner published")
    raw = stored.read_bytes()
    if snapshot_digest(snapshot) != manifest_digest(raw):
        raise ExportError(f"{snapshot}: its files do not match its manifest (torn or changed after publishing)")
    return manifest_digest(raw)


def base_model_of(config: Path) -> Path:
    """The base model directory of a run config: `[learner.model] path`."""
    from searchr1.core.settings import ConfigError, load_settings
    from searchr1.learner.settings import LearnerSettings

    try:
        path = Path(load_settings(LearnerSettings, config).model.path)
    except (ConfigError, ValueError) as exc:
        raise ExportError(f"cannot read the base model from {config}: {exc}") from None
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(16 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_weights(src: Path, dst: Path, dtype: str) -> str:
    """model.safetensors of the snapshot, its floating tensors cast to `dtype` (`auto`: as published),
    with the folder's metadata; returns the stored dtype. Holds the model once in memory."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    with safe_open(str(src), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
            tensors[name] = f.get_tensor(name)
    target = None if dtype == AS_PUBLISHED else getattr(torch, dtype)
    stored = AS_PUBLISHED
    for name, t in tensors.items():
        if t.is_floating_point():
            if target is not None:
                tensors[name] = t.to(target)
            stored = str(tensors[name].dtype).removeprefix("torch.")
    save_file(tensors, str(dst), metadata={"format": "pt"})
    return stored


def export_snapshot(run: Path, out: Path, *, base: Path, version: int | None = None, dtype: str = AS_PUBLISHED,
                    config: Path | None = None, force: bool = False) -> ExportResult:
    """Write the folder (module docstring) for `version` of `run` into `out`, tokenizer from `base`."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    version, snapshot, rebuilt = pick_snapshot(run, version)
    if not (base / "config.json").is_file():
        raise ExportError(f"base model directory {base} not found or has no config.json (its tokenizer and chat "
                          "template go into the folder): pass --base DIR")
    if not any((base / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ExportError(f"base model {base} has no tokenizer files")
    if out.exists() and any(out.iterdir()) and not force:
        raise ExportError(f"{out} exists and is not empty: choose another --out or pass --force")
    digest = verify_snapshot(snapshot, rebuilt)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, tmp / name)
    for name in ("config.json", "generation_config.json"):
        if (snapshot / name).is_file():
            shutil.copy2(snapshot / name, tmp / name)
        elif (base / name).is_file():
            shutil.copy2(base / name, tmp / name)
    stored = write_weights(snapshot / WEIGHTS_FILE, tmp / WEIGHTS_FILE, dtype)
    cfg = json.loads((tmp / "config.json").read_text())
    if stored != AS_PUBLISHED:
        cfg["dtype"] = stored
        cfg.pop("torch_dtype", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    _generation_config(tmp, base)
    result = ExportResult(out=out, version=version, snapshot_digest=digest,
                          weights_sha256=_sha256(tmp / WEIGHTS_FILE), dtype=stored, rebuilt=rebuilt)
    from searchr1.learner.tools.model_card import model_card

    (tmp / "README.md").write_text(model_card(run, result, base=base, config=config, model_config=cfg),
                                   encoding="utf-8")
    result.files = sorted(p.name for p in tmp.iterdir())
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return result


def _generation_config(folder: Path, base: Path) -> None:
    """generation_config.json ending a generation at the chat's end-of-turn token as well as EOS (the
    tokenizer's `eos_token`), so `generate` and vLLM stop where the rollout worker's engine stopped."""
    path = folder / "generation_config.json"
    gen = json.loads(path.read_text()) if path.is_file() else {}
    tok = json.loads((folder / "tokenizer_config.json").read_text()) if (folder / "tokenizer_config.json").is_file() else {}
    eos = gen.get("eos_token_id")
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    vocab = _token_ids(folder)
    for name in (tok.get("eos_token"), "<|im_end|>", "<|endoftext|>"):
        if isinstance(name, str) and name in vocab and vocab[name] not in ids:
            ids.append(vocab[name])
    if ids:
        gen["eos_token_id"] = ids if len(ids) > 1 else ids[0]
    gen.setdefault("_from_model_config", False)
    path.write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")


def _token_ids(folder: Path) -> dict[str, int]:
    """Special and added tokens → ids, from tokenizer.json."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text())
    return {t["content"]: int(t["id"]) for t in doc.get("added_tokens", []) if "content" in t and "id" in t}


def push_folder(folder: Path, repo: str, *, token: str | None = None, endpoint: str | None = None,
                private: bool = False, revision: str | None = None, message: str | None = None) -> str:
    """Upload `folder` to the Hub repository `repo` (created when missing) with `huggingface_hub`; returns
    the commit URL. `endpoint`: another Hub (HF_ENDPOINT works too)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model", revision=revision,
                             commit_message=message or f"searchr1 export of {folder.name}")
    return str(getattr(info, "commit_url", info))
