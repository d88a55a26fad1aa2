"""CLI commands of the retriever service, registered into `searchr1` by `searchr1.cli`:
`searchr1 index build`, `index import`, `index fetch`, `index convert`, `index info` and
`searchr1 serve retriever`.

Each command parses its flags and calls the run function that lives with the service (`runs.py` for the
index commands, `server.run` for the server, with `RetrieverSettings` loaded through the one validated
override path). Keep this module light: heavy imports happen inside the run functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from searchr1.core.commandline import INSECURE_HELP, fail, field_help, settings_or_exit, token_or_exit

if TYPE_CHECKING:
    from searchr1.cli import Groups

RETRIEVER_SETTINGS = "searchr1.retriever.settings:RetrieverSettings"

CONVENTIONS = ("auto", "e5", "bge", "plain")
POOLINGS = ("mean", "cls")
INDEX_SETTINGS = "searchr1.retriever.build_settings:IndexBuildSettings"
NlistOption = Annotated[int | None, typer.Option(min=1, help=field_help(INDEX_SETTINGS, "faiss.ivf_nlist"))]
PqOption = Annotated[int | None, typer.Option(min=0, help=field_help(INDEX_SETTINGS, "faiss.pq_m"))]
HnswMOption = Annotated[int | None, typer.Option(min=4, help=field_help(INDEX_SETTINGS, "faiss.hnsw_m"))]
EfOption = Annotated[int | None, typer.Option(min=8, help=field_help(INDEX_SETTINGS, "faiss.hnsw_ef_construction"))]


def _encoder(name: str, convention: str | None = None, pooling: str | None = None, normalize: bool | None = None,
             max_length: int | None = None) -> dict[str, Any]:
    """`EncoderSpec` fields (convention possibly `auto`) after checking the choices: the flags given, the
    `[index.encoder]` defaults for the others."""
    from searchr1.retriever.build_settings import EncoderBuildSettings

    if (convention or "auto") not in CONVENTIONS or (pooling or "mean") not in POOLINGS:
        fail("--convention must be auto|e5|bge|plain and --pooling mean|cls")
    given = {"convention": convention, "pooling": pooling, "normalize": normalize, "max_length": max_length}
    e = EncoderBuildSettings(name=name, **{k: v for k, v in given.items() if v is not None})
    return {"name": e.name, "convention": e.convention, "pooling": e.pooling, "normalize": e.normalize,
            "max_length": e.max_length}


def _faiss_params(hnsw_m: int | None, ef_construction: int | None, nlist: int | None, pq_m: int | None) -> Any:
    """`FaissParams` with the flags given; the others keep their declared defaults."""
    from dataclasses import replace

    from searchr1.retriever.indexes import FaissParams

    given = {"hnsw_m": hnsw_m, "hnsw_ef_construction": ef_construction, "ivf_nlist": nlist, "pq_m": pq_m}
    return replace(FaissParams.of(), **{k: v for k, v in given.items() if v is not None})


def _index_help(path: str) -> str:
    return field_help(INDEX_SETTINGS, path)


def build(
    corpus: Annotated[Path | None, typer.Option(help=_index_help("corpus"), exists=True, dir_okay=False)] = None,
    out: Annotated[Path | None, typer.Option(help=_index_help("out"))] = None,
    kind: Annotated[str | None, typer.Option(help=_index_help("kind"))] = None,
    encoder: Annotated[str | None, typer.Option(help=_index_help("encoder.name"))] = None,
    convention: Annotated[str | None, typer.Option(help=_index_help("encoder.convention"))] = None,
    pooling: Annotated[str | None, typer.Option(help=_index_help("encoder.pooling"))] = None,
    normalize: Annotated[bool | None, typer.Option("--normalize/--no-normalize",
                                                   help=_index_help("encoder.normalize"))] = None,
    max_length: Annotated[int | None, typer.Option(min=8, max=8192, help=_index_help("encoder.max_length"))] = None,
    chunk_size: Annotated[int | None, typer.Option(min=1, help=_index_help("chunk_size"))] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, help=_index_help("encoder.batch_size"))] = None,
    device: Annotated[str | None, typer.Option(help=_index_help("encoder.device"))] = None,
    fp16: Annotated[bool | None, typer.Option("--fp16/--no-fp16", help=_index_help("encoder.fp16"))] = None,
    bf16: Annotated[bool | None, typer.Option("--bf16/--no-bf16", help=_index_help("encoder.bf16"))] = None,
    threads: Annotated[int | None, typer.Option(min=0, help=_index_help("threads"))] = None,
    hnsw_m: HnswMOption = None,
    ef_construction: EfOption = None,
    nlist: NlistOption = None,
    pq_m: PqOption = None,
    keep_chunks: Annotated[bool | None, typer.Option("--keep-chunks/--no-keep-chunks",
                                                     help=_index_help("keep_chunks"))] = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help=_index_help("progress"))] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Run config (TOML/YAML): its index table gives every setting below; flags and "
                               "INDEX_* environment variables override it.")] = None,
) -> None:
    """Build a FAISS (flat, hnsw, ivfpq) or BM25 index over a corpus, with a manifest the server checks."""
    from searchr1.retriever.build_settings import IndexBuildSettings
    from searchr1.retriever.runs import run_build

    settings = settings_or_exit(
        IndexBuildSettings, config, corpus=corpus, out=out, kind=kind, chunk_size=chunk_size, threads=threads,
        keep_chunks=keep_chunks, progress=progress, encoder__name=encoder, encoder__convention=convention,
        encoder__pooling=pooling, encoder__normalize=normalize, encoder__max_length=max_length,
        encoder__batch_size=batch_size, encoder__device=device, encoder__fp16=fp16, encoder__bf16=bf16,
        faiss__hnsw_m=hnsw_m, faiss__hnsw_ef_construction=ef_construction, faiss__ivf_nlist=nlist,
        faiss__pq_m=pq_m)
    raise typer.Exit(run_build(settings))


def import_index(
    faiss_index: Annotated[Path, typer.Option("--faiss", help="Existing FAISS index file (e.g. e5_Flat.index).",
                                              exists=True, dir_okay=False)],
    corpus: Annotated[Path, typer.Option(help="The corpus JSONL its rows index (row i = line i).",
                                         exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option(help="Index directory to write.")],
    encoder: Annotated[str, typer.Option(help="The encoder that made the vectors (local directory).")],
    convention: Annotated[str | None, typer.Option(help=_index_help("encoder.convention"))] = None,
    pooling: Annotated[str | None, typer.Option(help=_index_help("encoder.pooling"))] = None,
    normalize: Annotated[bool | None, typer.Option(help=_index_help("encoder.normalize"))] = None,
    max_length: Annotated[int | None, typer.Option(min=8, max=8192, help="Tokens per query.")] = None,
    copy: Annotated[bool, typer.Option(help="Copy the index file instead of symlinking it.")] = False,
) -> None:
    """Adopt an existing FAISS index (Search-R1's prebuilt wiki-18 e5 index) without re-encoding."""
    from searchr1.retriever.runs import run_import

    spec = _encoder(encoder, convention, pooling, normalize, max_length)
    raise typer.Exit(run_import(faiss_index, corpus, out, spec, copy=copy))


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
    from searchr1.retriever.runs import run_fetch

    spec = _encoder(encoder, convention) if encoder is not None else None
    raise typer.Exit(run_fetch(
        out, index_repo=index_repo, parts=[p.strip() for p in parts.split(",") if p.strip()],
        corpus_repo=corpus_repo, corpus_file=corpus_file, revision=revision, endpoint=endpoint, sha256=sha256,
        verify=verify, keep_parts=keep_parts, encoder=spec))


def convert(
    src: Annotated[Path, typer.Option("--from", help="Flat index directory (built or imported).", exists=True,
                                      file_okay=False)],
    out: Annotated[Path, typer.Option(help="Index directory to write.")],
    kind: Annotated[str, typer.Option(help="ivfpq (small: for hosts that cannot hold the Flat index) | hnsw.")]
    = "ivfpq",
    nlist: NlistOption = None,
    pq_m: PqOption = None,
    hnsw_m: HnswMOption = None,
    ef_construction: EfOption = None,
    threads: Annotated[int, typer.Option(min=1, help="FAISS threads.")] = 1,
) -> None:
    """Rewrite a Flat index as IVF-PQ or HNSW without re-encoding (reads the Flat file memory-mapped)."""
    from searchr1.retriever.runs import run_convert

    raise typer.Exit(run_convert(src, out, kind, _faiss_params(hnsw_m, ef_construction, nlist, pq_m), threads))


def info(index: Annotated[Path, typer.Argument(help="Index directory.", exists=True, file_okay=False)]) -> None:
    """Print an index directory's manifest."""
    from searchr1.retriever.runs import run_info

    raise typer.Exit(run_info(index))


def serve_retriever(
    index: Annotated[Path | None, typer.Option(help=field_help(RETRIEVER_SETTINGS, "index"))] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Run config (TOML/YAML); its `retriever` table is used.")] = None,
    corpus: Annotated[Path | None, typer.Option(help=field_help(RETRIEVER_SETTINGS, "corpus"))] = None,
    host: Annotated[str | None, typer.Option(help=field_help(RETRIEVER_SETTINGS, "host"))] = None,
    grpc_port: Annotated[int | None, typer.Option(help=field_help(RETRIEVER_SETTINGS, "grpc_port"))] = None,
    http_port: Annotated[int | None, typer.Option(help=field_help(RETRIEVER_SETTINGS, "http_port"))] = None,
    metrics_port: Annotated[int | None, typer.Option(help=field_help(RETRIEVER_SETTINGS, "metrics_port"))] = None,
    insecure_no_auth: Annotated[bool | None, typer.Option("--insecure-no-auth", help=INSECURE_HELP)] = None,
) -> None:
    """Serve an index, or a web search API (`backend = "web"`), over gRPC (Search, health, reflection) and
    HTTP POST /retrieve (Search-R1's API).

    Prints one `retriever ready …` line when both servers accept requests; SIGTERM/SIGINT drain and stop it.
    Other settings come from --config and RETRIEVER_* environment variables (docs/retriever.md)."""
    from searchr1.retriever.settings import RetrieverSettings


    settings = settings_or_exit(RetrieverSettings, config, index=index, corpus=corpus, host=host,
                                grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port,
                                auth__insecure_no_auth=insecure_no_auth)
    token_or_exit(settings.token, settings.auth, server="the retriever", setting="RETRIEVER_TOKEN ([retriever] token)")
    from searchr1.retriever.server import run

    raise typer.Exit(run(settings))


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""
    groups.index.command("build")(build)
    groups.index.command("import")(import_index)
    groups.index.command("fetch")(fetch)
    groups.index.command("convert")(convert)
    groups.index.command("info")(info)
    groups.serve.command("retriever")(serve_retriever)
