"""Index loader: open an index directory for serving, after checking its manifest against the corpus,
the encoder and the index file itself; a mismatch is refused with an `IndexMismatchError` that says
how to fix it. The corpus is the one the manifest names (resolved against the index directory) unless
the caller passes another path.

Departure from Search-R1: its server loads whatever index/corpus pair it is given, unchecked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.retriever.corpus import Corpus, file_sha256, quick_fingerprint
from searchr1.retriever.encoders import Encoder, EncoderSpec
from searchr1.retriever.indexes import BM25Searcher, DenseSearcher, FaissParams
from searchr1.retriever.manifest import BM25_DIR, FAISS_FILE, OFFSETS, IndexMismatchError, Manifest

log = logging.getLogger("searchr1.retriever")


@dataclass
class LoadedIndex:
    """An index directory opened for serving."""

    manifest: Manifest
    corpus: Corpus
    searcher: Any
    """A `Searcher` (DenseSearcher or BM25Searcher)."""


def check_corpus(manifest: Manifest, corpus_path: Path, *, full: bool) -> None:
    """Refuse a corpus that is not the one the index was built from."""
    if not corpus_path.is_file():
        raise IndexMismatchError(f"corpus {corpus_path} not found (the index was built from {manifest.corpus.path}; "
                                 "pass --corpus to point at its new location)")
    size = corpus_path.stat().st_size
    if size != manifest.corpus.size:
        raise IndexMismatchError(f"corpus {corpus_path} has {size} bytes but the index was built from one with "
                                 f"{manifest.corpus.size} bytes ({manifest.corpus.path}): rebuild the index")
    if quick_fingerprint(corpus_path) != manifest.corpus.fingerprint or (
            full and file_sha256(corpus_path) != manifest.corpus.sha256):
        raise IndexMismatchError(f"corpus {corpus_path} differs from the one the index was built from "
                                 f"(sha256 {manifest.corpus.sha256[:12]}…): rebuild the index")


def check_encoder(manifest: Manifest, spec: EncoderSpec | None, dim: int | None = None) -> None:
    """Refuse an encoder other than the one whose vectors are in the index."""
    built = manifest.encoder_spec
    if spec is not None and built is not None and spec != built:
        raise IndexMismatchError(f"the index was built with encoder {built} but the server is configured with {spec}")
    if dim is not None and dim != manifest.dim:
        raise IndexMismatchError(f"encoder {built.name if built else '?'} makes {dim}-dim vectors but the index "
                                 f"holds {manifest.dim}-dim ones")


def to_gpu(index):
    """Shard a FAISS index over every visible GPU (faiss-gpu builds); stays on CPU, with a warning, when
    there is no GPU or the kind has no GPU implementation (HNSW)."""
    import faiss

    n = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if n == 0:
        log.warning("search.faiss_gpu is set but FAISS sees no GPU (faiss-cpu build?): searching on CPU")
        return index
    try:
        options = faiss.GpuMultipleClonerOptions()
        options.shard = True
        return faiss.index_cpu_to_all_gpus(index, co=options)
    except RuntimeError as exc:
        log.warning("cannot move this index to GPU (%s): searching on CPU", exc)
        return index


def load_index(
    index_dir: str | Path,
    *,
    encoder_factory: Callable[[EncoderSpec], Encoder] | None = None,
    expected_encoder: EncoderSpec | None = None,
    corpus_path: str | Path | None = None,
    search_params: dict[str, Any] | None = None,
    full_check: bool = False,
    threads: int = 1,
    bm25_numba: bool | None = None,
    gpu: bool = False,
    mmap: bool = False,
) -> LoadedIndex:
    """Open an index directory: check manifest vs corpus, encoder and index file, then build its searcher.

    `mmap`: map the FAISS file read-only instead of reading it into memory (a Flat index larger than RAM
    is then paged in by the OS as it is searched; not combined with `gpu`)."""
    index_dir = Path(index_dir)
    manifest = Manifest.read(index_dir)
    cpath = Path(corpus_path).resolve() if corpus_path else Path(manifest.corpus.path)
    check_corpus(manifest, cpath, full=full_check)
    offsets = np.load(index_dir / OFFSETS, mmap_mode="r")
    if len(offsets) != manifest.count:
        raise IndexMismatchError(f"{index_dir / OFFSETS} has {len(offsets)} rows, the manifest {manifest.count}")
    corpus = Corpus(cpath, offsets)
    if manifest.kind == "bm25":
        searcher: Any = BM25Searcher(index_dir / BM25_DIR, threads=threads, numba=bm25_numba)
        if searcher.count != manifest.count:
            raise IndexMismatchError(f"BM25 index holds {searcher.count} documents, the manifest {manifest.count}")
        return LoadedIndex(manifest, corpus, searcher)

    import faiss

    spec = manifest.encoder_spec
    assert spec is not None
    check_encoder(manifest, expected_encoder)
    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap and not gpu else 0
    index = faiss.read_index(str(index_dir / FAISS_FILE), flags)
    if index.ntotal != manifest.count or index.d != manifest.dim:
        raise IndexMismatchError(f"{index_dir / FAISS_FILE} holds {index.ntotal}×{index.d}, the manifest says "
                                 f"{manifest.count}×{manifest.dim}")
    if gpu:
        index = to_gpu(index)
    if encoder_factory is None:
        raise ValueError("a dense index needs an encoder_factory")
    encoder = encoder_factory(spec)
    check_encoder(manifest, None, encoder.dim)
    faiss_params = replace(FaissParams.of(), **{**manifest.faiss, **(search_params or {})})
    return LoadedIndex(manifest, corpus, DenseSearcher(encoder, index, faiss_params))
