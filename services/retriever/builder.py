"""Index builder: corpus → (encoded chunks →) FAISS or BM25 index directory with a manifest
(the directory layout is described in `manifest`); also adopts an existing FAISS index.

A dense build is resumable: embeddings are written in atomic chunks, and a re-run with the same corpus,
encoder and chunk size skips the chunks already there. Loading and its checks live in `loading`.

Departure from Search-R1: Search-R1 builds indexes with FlashRAG's `index_builder.py` in one go (no
resume, no manifest); a server given the wrong index/corpus pair answers with the wrong passages.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.retriever.corpus import CorpusScan, iter_passages, scan_corpus
from searchr1.retriever.encoders import Encoder, EncoderSpec
from searchr1.retriever.indexes import DENSE_KINDS, FaissParams, IndexKind, build_bm25, new_faiss_index
from searchr1.retriever.manifest import (
    BM25_DIR,
    CHUNKS_DIR,
    FAISS_FILE,
    MANIFEST,
    OFFSETS,
    STATE,
    CorpusInfo,
    IndexMismatchError,
    Manifest,
    atomic_save_npy,
    atomic_write_text,
    corpus_info,
)

PROGRESS_STEP = 1024
"""Passages encoded between two progress-bar updates."""
IVF_TRAIN_MAX = 262_144
"""At most this many vectors train an IVF-PQ index (a uniform sample across the chunks)."""


@contextmanager
def rich_progress(enabled: bool = True) -> Iterator[Callable[[str, int, int], None]]:
    """A callback `advance(task_name, done, total)` drawing rich progress bars (no-op when disabled)."""
    if not enabled:
        yield lambda name, done, total: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    tasks: dict[str, Any] = {}
    # the spinner and elapsed time move during a step with one tick (the BM25 build: 0/1 until it is done)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True)) as p:
        def advance(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = p.add_task(name, total=total)
            p.update(tasks[name], completed=done, total=total)

        yield advance


def build_index(
    corpus_path: str | Path,
    out: str | Path,
    kind: IndexKind,
    *,
    encoder: Encoder | None = None,
    encoder_spec: EncoderSpec | None = None,
    params: FaissParams | None = None,
    chunk_size: int | None = None,
    keep_chunks: bool | None = None,
    progress: Callable[[str, int, int], None] = lambda name, done, total: None,
) -> Manifest:
    """Build an index of `kind` over the corpus into `out` (resuming a dense build's finished chunks). A
    dense build needs `chunk_size` and `keep_chunks` (`[index]`'s); BM25 reads neither."""
    corpus_path = Path(corpus_path).resolve()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # the directory is "unfinished" until the new manifest lands
    scan = scan_corpus(corpus_path)
    count = len(scan.offsets)
    if count == 0:
        raise ValueError(f"corpus {corpus_path} has no rows")
    atomic_save_npy(out / OFFSETS, scan.offsets)
    info = CorpusInfo(str(corpus_path), scan.size, scan.sha256, scan.fingerprint)

    if kind == "bm25":
        progress("bm25 index", 0, 1)
        build_bm25((p.contents for _, p in iter_passages(corpus_path)), out / BM25_DIR)
        progress("bm25 index", 1, 1)
        manifest = Manifest(kind="bm25", count=count, corpus=info, created_at=time.time())
        manifest.write(out)
        return manifest
    if kind not in DENSE_KINDS:
        raise ValueError(f"unknown index kind {kind!r}; known: {(*DENSE_KINDS, 'bm25')}")
    if encoder is None or encoder_spec is None:
        raise ValueError(f"a {kind} index needs an encoder")
    if chunk_size is None or keep_chunks is None:
        raise ValueError(f"a {kind} index needs chunk_size and keep_chunks")

    chunk_dir = out / CHUNKS_DIR
    _check_or_start_state(out, scan, encoder_spec, chunk_size)
    chunk_dir.mkdir(exist_ok=True)
    n_chunks = (count + chunk_size - 1) // chunk_size
    done = [i for i in range(n_chunks) if (chunk_dir / f"{i:06d}.npy").is_file()]
    done_set = set(done)
    first_missing = next((i for i in range(n_chunks) if i not in done_set), n_chunks)
    encoded = min(count, len(done) * chunk_size)
    progress("encode passages", encoded, count)
    batch: list[str] = []
    for row, passage in iter_passages(corpus_path, start=first_missing * chunk_size):
        if row // chunk_size in done_set:
            continue
        batch.append(passage.contents)
        if len(batch) == chunk_size or row == count - 1:
            parts = []
            for start in range(0, len(batch), PROGRESS_STEP):  # finer progress than one tick per chunk
                parts.append(encoder.encode_passages(batch[start : start + PROGRESS_STEP]))
                encoded += len(parts[-1])
                progress("encode passages", encoded, count)
            atomic_save_npy(chunk_dir / f"{row // chunk_size:06d}.npy", np.concatenate(parts))
            batch = []
    vectors = [np.load(chunk_dir / f"{i:06d}.npy", mmap_mode="r") for i in range(n_chunks)]
    manifest = write_dense_index(vectors, out, kind, encoder_spec, info, params or FaissParams.of(),
                                 progress=progress)
    if not keep_chunks:
        shutil.rmtree(chunk_dir, ignore_errors=True)
        (out / STATE).unlink(missing_ok=True)
    return manifest


def _check_or_start_state(out: Path, scan: CorpusScan, spec: EncoderSpec, chunk_size: int) -> None:
    """Chunks on disk are reused only if they came from the same corpus, encoder and chunk size."""
    state = {"corpus_sha256": scan.sha256, "encoder": asdict(spec), "chunk_size": chunk_size}
    path = out / STATE
    if path.is_file() and json.loads(path.read_text()) != state:
        shutil.rmtree(out / CHUNKS_DIR, ignore_errors=True)  # stale chunks from another corpus/encoder
    atomic_write_text(path, json.dumps(state, sort_keys=True))


def write_dense_index(
    chunks: list[np.ndarray],
    out: Path,
    kind: str,
    spec: EncoderSpec,
    info: CorpusInfo,
    params: FaissParams,
    *,
    progress: Callable[[str, int, int], None] = lambda name, done, total: None,
) -> Manifest:
    """Make the FAISS index from embedding chunks (row order), save it and the manifest."""
    import faiss

    count = sum(len(c) for c in chunks)
    dim = int(chunks[0].shape[1])
    index = new_faiss_index(kind, dim, count, params)  # type: ignore[arg-type]
    if not index.is_trained:
        rng = np.random.default_rng(0)
        take = min(count, IVF_TRAIN_MAX)
        sample = np.sort(rng.choice(count, size=take, replace=False))
        index.train(_gather(chunks, sample))
    added = 0
    for c in chunks:
        index.add(np.ascontiguousarray(c, dtype=np.float32))
        added += len(c)
        progress(f"{kind} index", added, count)
    tmp = out / (FAISS_FILE + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out / FAISS_FILE)
    manifest = Manifest(kind=kind, count=count, corpus=info, dim=dim, encoder=asdict(spec),
                        faiss=asdict(params), created_at=time.time())
    manifest.write(out)
    return manifest


def _gather(chunks: list[np.ndarray], rows: np.ndarray) -> np.ndarray:
    out = np.empty((len(rows), chunks[0].shape[1]), dtype=np.float32)
    starts = np.cumsum([0] + [len(c) for c in chunks])
    for j, r in enumerate(rows):
        ci = int(np.searchsorted(starts, r, side="right") - 1)
        out[j] = chunks[ci][r - starts[ci]]
    return out


def faiss_kind(index) -> str:
    """flat / hnsw / ivfpq for a FAISS index, by its type."""
    import faiss

    if isinstance(index, faiss.IndexFlat):
        return "flat"
    if isinstance(index, faiss.IndexHNSW):
        return "hnsw"
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and isinstance(ivf, faiss.IndexIVFPQ):
        return "ivfpq"
    raise ValueError(f"unsupported FAISS index type {type(index).__name__} (flat, HNSW or IVF-PQ expected)")


def faiss_metric(index) -> str:
    """ip / l2 for a FAISS index's metric type."""
    import faiss

    names = {faiss.METRIC_INNER_PRODUCT: "ip", faiss.METRIC_L2: "l2"}
    if index.metric_type not in names:
        raise ValueError(f"unsupported FAISS metric type {index.metric_type} (inner product or L2 expected)")
    return names[index.metric_type]


def import_faiss_index(faiss_path: str | Path, corpus_path: str | Path, out: str | Path, spec: EncoderSpec,
                       *, link: bool = True) -> Manifest:
    """Adopt an existing FAISS index (e.g. Search-R1's prebuilt `e5_Flat.index` over wiki-18, rows = corpus
    lines) without re-encoding: check its row count against the corpus, write offsets and the manifest
    (encoder, convention, dimension, metric), and symlink (or copy) the index file. The encoder spec is taken on trust — it must be the one that
    made the vectors (Search-R1's: intfloat/e5-base-v2, e5 convention, mean pooling, normalised)."""
    import faiss

    faiss_path, out = Path(faiss_path).resolve(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    index = faiss.read_index(str(faiss_path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    kind = faiss_kind(index)
    scan = scan_corpus(corpus_path)
    if index.ntotal != len(scan.offsets):
        raise IndexMismatchError(f"{faiss_path} holds {index.ntotal} vectors but {corpus_path} has "
                                 f"{len(scan.offsets)} rows: not the index of this corpus")
    atomic_save_npy(out / OFFSETS, scan.offsets)
    target = out / FAISS_FILE
    target.unlink(missing_ok=True)
    if link:
        target.symlink_to(faiss_path)
    else:
        shutil.copyfile(faiss_path, target)
    manifest = Manifest(kind=kind, count=int(index.ntotal), corpus=corpus_info(corpus_path, scan), dim=int(index.d),
                        encoder=asdict(spec), faiss=asdict(FaissParams.of()), metric=faiss_metric(index),
                        created_at=time.time())
    manifest.write(out)
    return manifest
