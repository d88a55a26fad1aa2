"""The index directory's manifest: what an index was built from, written last by a build and read
first by a load.

An index directory holds:
- `manifest.json`: kind, encoder spec (dense), dim, count, corpus path/size/sha256/quick fingerprint,
  FAISS parameters, format version. Written last, so a directory without it is an unfinished build.
- `offsets.npy`: int64 byte offset of every corpus row (the server memory-maps the corpus with it).
- `index.faiss` (dense) or `bm25/` (bm25s arrays + JSON; nothing pickled).
- `chunks/` while a dense build runs: one `.npy` of embeddings per `chunk_size` passages, written
  atomically; a re-run with the same corpus and encoder skips the chunks already there (resumable).

The corpus path is stored relative to the index directory, so an index moved together with its corpus
(a copy to another host, a container mount) still finds it; manifests that hold an absolute path are
read as they are. In memory, `Manifest.corpus.path` is always absolute.

This module owns the file format and its atomic writes, not the build (`builder`) nor the checks at
load (`loading`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.retriever.corpus import CorpusScan, scan_corpus
from searchr1.retriever.encoders import EncoderSpec

MANIFEST = "manifest.json"
OFFSETS = "offsets.npy"
FAISS_FILE = "index.faiss"
BM25_DIR = "bm25"
CHUNKS_DIR = "chunks"
STATE = "build-state.json"
FORMAT_VERSION = 1


class IndexMismatchError(RuntimeError):
    """The index directory does not fit the corpus, the encoder or itself; the message says how."""


@dataclass(frozen=True, slots=True)
class CorpusInfo:
    path: str
    """Path of the corpus the index was built from: absolute in memory, relative to the index directory
    in `manifest.json` (absolute in manifests written before paths were stored relative)."""
    size: int
    """File size in bytes."""
    sha256: str
    """sha256 of the whole file."""
    fingerprint: str
    """Quick fingerprint (size + first and last MiB), checked at every load."""


@dataclass(frozen=True, slots=True)
class Manifest:
    kind: str
    """flat, hnsw, ivfpq or bm25."""
    count: int
    """Rows indexed (= corpus rows)."""
    corpus: CorpusInfo
    """Which corpus file the rows index."""
    dim: int = 0
    """Embedding dimension (0 for bm25)."""
    encoder: dict[str, Any] | None = None
    """EncoderSpec as a dict (None for bm25)."""
    faiss: dict[str, Any] = field(default_factory=dict)
    """FaissParams used to build (dense kinds)."""
    metric: str = "ip"
    """Similarity of the dense index: ip (inner product, what builds write) or l2 (an imported index)."""
    format_version: int = FORMAT_VERSION
    created_at: float = 0.0

    def write(self, out: Path) -> None:
        """Write `manifest.json` into `out`, the corpus path made relative to `out`."""
        data = asdict(self)
        data["corpus"]["path"] = os.path.relpath(Path(self.corpus.path).resolve(), Path(out).resolve())
        atomic_write_text(out / MANIFEST, json.dumps(data, indent=2, sort_keys=True))

    @classmethod
    def read(cls, index_dir: Path) -> Manifest:
        """Read `index_dir/manifest.json`, resolving a relative corpus path against `index_dir`."""
        path = index_dir / MANIFEST
        if not path.is_file():
            raise IndexMismatchError(
                f"{index_dir} has no {MANIFEST}: not an index directory, or its build did not finish "
                f"(re-run `searchr1 index build` with the same arguments to resume)")
        data = json.loads(path.read_text())
        if data.get("format_version") != FORMAT_VERSION:
            raise IndexMismatchError(f"{path}: format_version {data.get('format_version')} != {FORMAT_VERSION}")
        info = CorpusInfo(**data["corpus"])
        data["corpus"] = replace(info, path=str(resolve_corpus_path(index_dir, info.path)))
        return cls(**data)

    @property
    def encoder_spec(self) -> EncoderSpec | None:
        return EncoderSpec(**self.encoder) if self.encoder else None


def resolve_corpus_path(index_dir: Path, stored: str) -> Path:
    """The corpus a manifest names: an absolute path as is, a relative one against the index directory."""
    p = Path(stored)
    return p if p.is_absolute() else (Path(index_dir).resolve() / p).resolve()


def corpus_info(path: str | Path, scan: CorpusScan | None = None) -> CorpusInfo:
    """Manifest description of a corpus file (one streaming pass unless `scan` is given)."""
    scan = scan or scan_corpus(path)
    return CorpusInfo(str(Path(path).resolve()), scan.size, scan.sha256, scan.fingerprint)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)
