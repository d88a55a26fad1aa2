"""What the `searchr1 index …` commands run: build, import, fetch and convert an index, each returning the
command's exit code (2: an input it cannot use). The commands (`commands.py`) only parse flags."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.core.commandline import error

if TYPE_CHECKING:
    from searchr1.retriever.build_settings import IndexBuildSettings
    from searchr1.retriever.indexes import FaissParams


def _error(message: str) -> int:
    return error(message)


def run_build(settings: IndexBuildSettings) -> int:
    """Build the `settings.kind` index over `settings.corpus` into `settings.out`; `threads` 0 means every
    core this process may use."""
    import time

    from rich.console import Console

    from searchr1.core.openmp import passive_openmp_waits
    from searchr1.retriever.builder import build_index, rich_progress
    from searchr1.retriever.threads import available_cores

    if settings.corpus is None or settings.out is None:
        return _error("give the corpus and the index directory (--corpus and --out, or corpus and out in the "
                      "run config's index table)")
    if not settings.corpus.is_file():
        return _error(f"corpus file not found: {settings.corpus}")
    threads = settings.threads or available_cores()
    e = settings.encoder
    passive_openmp_waits()  # before torch and faiss load
    enc = spec = None
    if settings.kind != "bm25":
        import torch

        from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder, resolve_convention

        torch.set_num_threads(threads)
        spec = EncoderSpec(name=e.name, convention=resolve_convention(e.convention, e.name), pooling=e.pooling,
                           normalize=e.normalize, max_length=e.max_length)
        try:
            enc = TransformerEncoder(spec, device=e.device, fp16=e.fp16, bf16=e.bf16, batch_size=e.batch_size)
        except FileNotFoundError as exc:
            return _error(str(exc))
    from searchr1.retriever.indexes import FaissParams, configure_faiss

    configure_faiss(threads)
    t0 = time.perf_counter()
    with rich_progress(settings.progress) as advance:
        manifest = build_index(settings.corpus, settings.out, settings.kind, encoder=enc,  # type: ignore[arg-type]
                               encoder_spec=spec, params=FaissParams.for_build(settings.faiss),
                               chunk_size=settings.chunk_size, keep_chunks=settings.keep_chunks, progress=advance)
    elapsed = time.perf_counter() - t0
    Console(stderr=True).print(
        f"[green]built[/] {manifest.kind} index of {manifest.count} passages"
        f"{f' ({manifest.dim}-dim, {spec.name})' if spec else ''} in {settings.out}: {elapsed:.1f} s, "
        f"{manifest.count / max(elapsed, 1e-9):.1f} passages/s "
        f"({threads} threads{', bf16' if e.bf16 and spec else ''})")
    return 0


def run_import(faiss_index: Path, corpus: Path, out: Path, encoder: dict[str, Any], *, copy: bool) -> int:
    """Adopt an existing FAISS index over `corpus` into `out` (symlinked unless `copy`)."""
    from searchr1.core.progress import working
    from searchr1.retriever.builder import import_faiss_index
    from searchr1.retriever.encoders import EncoderSpec, resolve_convention
    from searchr1.retriever.manifest import IndexMismatchError

    spec = EncoderSpec(**{**encoder, "convention": resolve_convention(encoder["convention"], encoder["name"])})
    try:
        with working(f"importing {faiss_index.name}: scanning the corpus (sha256, row offsets), checking the index"):
            m = import_faiss_index(faiss_index, corpus, out, spec, link=not copy)
    except (IndexMismatchError, ValueError) as exc:
        return _error(str(exc))
    print(f"imported {m.kind} index of {m.count} × {m.dim} into {out}", file=sys.stderr)
    return 0


def run_fetch(out: Path, *, index_repo: str, parts: list[str], corpus_repo: str, corpus_file: str,
              revision: str | None, endpoint: str | None, sha256: str | None, verify: bool, keep_parts: bool,
              encoder: dict[str, Any] | None) -> int:
    """Fetch Search-R1's corpus and Flat index into `out`; with `encoder`, import them into OUT/index."""
    from searchr1.retriever.fetch import FetchError, fetch_corpus, fetch_index

    try:
        idx = fetch_index(out, repo_id=index_repo, parts=parts, revision=revision, endpoint=endpoint,
                          expected_sha256=sha256, verify=verify, keep_parts=keep_parts)
        corpus = fetch_corpus(out, repo_id=corpus_repo, filename=corpus_file, revision=revision,
                              endpoint=endpoint, keep_archive=keep_parts)
    except (FetchError, ValueError, OSError) as exc:
        return _error(str(exc))
    for f in (idx, corpus):
        print(f"{'kept' if f.reused else 'fetched'} {f.path} ({f.size} bytes, sha256 {f.sha256})", file=sys.stderr)
    if encoder is None:
        print(f"next: searchr1 index import --faiss {idx.path} --corpus {corpus.path} --out {out / 'index'} "
              "--encoder <local e5-base-v2 directory> --convention e5", file=sys.stderr)
        return 0
    return run_import(idx.path, corpus.path, out / "index", encoder, copy=False)


def run_convert(src: Path, out: Path, kind: str, params: FaissParams, threads: int) -> int:
    """Rewrite the Flat index in `src` as `kind` into `out`."""
    from searchr1.retriever.builder import rich_progress
    from searchr1.retriever.convert import convert_index
    from searchr1.retriever.indexes import configure_faiss
    from searchr1.retriever.manifest import IndexMismatchError

    configure_faiss(threads)
    try:
        with rich_progress(True) as advance:
            m = convert_index(src, out, kind, params=params, progress=advance)
    except (IndexMismatchError, ValueError) as exc:
        return _error(str(exc))
    print(f"converted {m.count} × {m.dim} into a {m.kind} index in {out}", file=sys.stderr)
    return 0


def run_info(index: Path) -> int:
    """Print an index directory's manifest as JSON."""
    import json
    from dataclasses import asdict

    from searchr1.retriever.manifest import IndexMismatchError, Manifest

    try:
        print(json.dumps(asdict(Manifest.read(index)), indent=2))
    except IndexMismatchError as exc:
        return _error(str(exc))
    return 0
