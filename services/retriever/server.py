"""Assemble and run the retriever server from `RetrieverSettings`: load (and check) the index, pin
threads, start the micro-batcher, the gRPC server (health + reflection + auth) and the HTTP server,
report readiness, and shut down gracefully on SIGTERM/SIGINT.

Stages, top to bottom: load index → build searcher (+ hybrid / rerank) → batcher → service → servers →
wait for a signal → drain (health NOT_SERVING, in-flight calls finish) → close. With `backend = "web"`
the first three stages are replaced by opening the web search backend (`retriever/web/`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from searchr1.core.api import retriever_pb2_grpc
from searchr1.core.metrics import MetricsServer, start_metrics_server
from searchr1.core.openmp import passive_openmp_waits
from searchr1.core.servers import GrpcServer, HttpServer, install_shutdown_signals
from searchr1.core.supervise import Supervisor, TaskDied
from searchr1.retriever.batcher import MicroBatcher
from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder
from searchr1.retriever.indexes import HybridSearcher, RerankingSearcher, configure_faiss
from searchr1.retriever.loading import LoadedIndex, load_index
from searchr1.retriever.manifest import IndexMismatchError
from searchr1.retriever.metrics import RetrieverMetrics
from searchr1.retriever.service import SERVICE_NAME, RetrieverService, RetrieverServicer, create_app
from searchr1.retriever.settings import RetrieverSettings
from searchr1.retriever.threads import ThreadPolicy

log = logging.getLogger("searchr1.retriever")


def event_loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop factory for `asyncio.Runner`: uvloop's for `uvloop` (ImportError when missing) and for
    `auto` when it is installed, else None (asyncio's default loop). The HTTP and gRPC servers and the
    batcher share one loop, so its cost per wake-up is paid on every request (docs/performance.md,
    "Retriever")."""
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.new_event_loop
    return None


def pin_threads(torch_threads: int, faiss_threads: int, blas_threshold: int) -> None:
    """Set torch and FAISS thread counts. OpenMP's setting is per calling thread: run this on the thread
    that searches (the batcher's worker)."""
    import torch

    torch.set_num_threads(torch_threads)
    configure_faiss(faiss_threads, blas_threshold)


def open_index(settings: RetrieverSettings) -> LoadedIndex:
    """Load the configured index (and its hybrid partner / reranker) with every manifest check."""
    if settings.index is None:
        raise IndexMismatchError("no index configured: pass --index DIR (or RETRIEVER_INDEX)")
    s = settings.search

    def encoder_factory(spec: EncoderSpec) -> TransformerEncoder:
        return TransformerEncoder(spec, device=s.device, fp16=s.fp16, batch_size=s.encoder_batch_size,
                                  trace=s.encoder_trace)

    def _load(path) -> LoadedIndex:
        return load_index(path, encoder_factory=encoder_factory, corpus_path=settings.corpus,
                          full_check=settings.full_checksum, threads=settings.faiss_threads, gpu=s.faiss_gpu,
                          mmap=s.faiss_mmap,
                          search_params={"hnsw_ef_search": s.hnsw_ef_search, "ivf_nprobe": s.ivf_nprobe})

    loaded = _load(settings.index)
    searcher = loaded.searcher
    if s.hybrid_with is not None:
        other = _load(s.hybrid_with)
        if other.manifest.corpus.sha256 != loaded.manifest.corpus.sha256:
            raise IndexMismatchError(f"hybrid indexes {settings.index} and {s.hybrid_with} were built from "
                                     "different corpora")
        other.corpus.close()
        searcher = HybridSearcher([searcher, other.searcher], depth=s.hybrid_depth, rrf_k=s.rrf_k)
    if s.rerank_model:
        from searchr1.retriever.indexes import cross_encoder_reranker

        searcher = RerankingSearcher(searcher, cross_encoder_reranker(s.rerank_model, device=s.device),
                                     loaded.corpus, depth=s.rerank_depth)
    return replace(loaded, searcher=searcher)


@dataclass
class RunningRetriever:
    """Handles to a started retriever (tests and the CLI stop it with `stop()`)."""

    service: RetrieverService
    batcher: MicroBatcher | None
    """None with a web search backend."""
    grpc: GrpcServer
    http: HttpServer | None
    metrics_server: MetricsServer | None
    grace_s: float
    host: str
    description: str = ""
    """What it serves, for the ready line (`index=DIR (flat, N passages)`, `backend=web provider=…`)."""

    @property
    def grpc_address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.grpc.port}"

    def supervise(self, supervisor: Supervisor) -> Supervisor:
        """Hand the background work to `supervisor`: the micro-batcher's loop, the gRPC server, the HTTP
        server's serve task, the metrics server's thread (a death of any stops the retriever, exit 1)."""
        if self.batcher is not None and self.batcher.task is not None:
            supervisor.watch("micro-batcher", self.batcher.task)
        if self.http is not None and self.http.task is not None:
            supervisor.watch("http server", self.http.task)
        supervisor.spawn("grpc server", self.grpc.wait())  # ends only when the server terminates
        if self.metrics_server is not None:
            supervisor.bind()
            self.metrics_server.on_death = supervisor.fail
        return supervisor

    async def stop(self) -> None:
        await self.grpc.stop(self.grace_s)
        if self.http is not None:
            await self.http.stop()
        if self.batcher is not None:
            await self.batcher.stop()
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.service.corpus is not None:
            self.service.corpus.close()
        if self.service.backend is not None:
            await self.service.backend.close()


async def start_retriever(settings: RetrieverSettings, loaded: LoadedIndex,
                          metrics: RetrieverMetrics | None = None) -> RunningRetriever:
    """Start batcher, gRPC and HTTP (and metrics) servers over an opened index."""
    metrics = metrics or RetrieverMetrics.create()
    policy = ThreadPolicy.from_settings(settings)
    searcher = loaded.searcher

    def search(queries, k):  # on the batcher's thread: threads sized to this batch, then the search
        policy.apply(len(queries))
        return searcher.search(queries, k)

    batcher = MicroBatcher(search, settings.batch, settings.limits, metrics=metrics)
    batcher.run_sync(pin_threads, settings.torch_threads, settings.faiss_threads, settings.faiss_blas_threshold)
    batcher.run_sync(search, ["warm up"], 1)  # JIT/first-call costs before we say ready
    await batcher.start()
    info = served_info(settings, loaded)
    service = RetrieverService(loaded.corpus, batcher, settings.limits, metrics, info=info)
    try:
        grpc_server, http, metrics_server = await start_servers(settings, service)
    except BaseException:
        await batcher.stop()
        raise
    return RunningRetriever(service, batcher, grpc_server, http, metrics_server, settings.shutdown_grace_s,
                            settings.host, f"index={settings.index} ({info['kind']}, {info['count']} passages)")


def served_info(settings: RetrieverSettings, loaded: Any) -> dict[str, Any]:
    """What an index retriever serves, for `/healthz` and the gRPC `Info` call (an evaluation's setting
    fingerprint): index kind, passages, dimension and encoder; the corpus's name, size and sha256; the
    index's digest (sha256 of its manifest.json); the search settings that change results; the top-k
    limits."""
    import hashlib

    m = loaded.manifest
    manifest = settings.index / "manifest.json" if settings.index is not None else None
    index_sha = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest and manifest.is_file() else None
    s = settings.search
    return {
        "kind": m.kind, "count": m.count, "dim": m.dim, "encoder": m.encoder["name"] if m.encoder else None,
        "corpus": {"name": Path(m.corpus.path).name, "size": m.corpus.size, "sha256": m.corpus.sha256},
        "index_sha256": index_sha,
        "search": {"hnsw_ef_search": s.hnsw_ef_search, "ivf_nprobe": s.ivf_nprobe,
                   "hybrid_with": str(s.hybrid_with) if s.hybrid_with else None, "rrf_k": s.rrf_k,
                   "hybrid_depth": s.hybrid_depth, "rerank_model": s.rerank_model, "rerank_depth": s.rerank_depth},
        "default_top_k": settings.limits.default_top_k, "max_top_k": settings.limits.max_top_k,
    }


async def start_web_retriever(settings: RetrieverSettings, metrics: RetrieverMetrics | None = None) -> RunningRetriever:
    """Start gRPC and HTTP (and metrics) servers over a web search backend (`backend = "web"`): no index, no
    micro-batcher; each query is answered from the cache or one API request."""
    from searchr1.retriever.web.assemble import open_web_backend
    from searchr1.retriever.web.metrics import WebMetrics

    metrics = metrics or RetrieverMetrics.create()
    backend = await open_web_backend(settings.web, WebMetrics.create(metrics.registry))
    service = RetrieverService(None, None, settings.limits, metrics, info=backend.info, backend=backend)
    try:
        grpc_server, http, metrics_server = await start_servers(settings, service)
    except BaseException:
        await backend.close()
        raise
    w = settings.web
    return RunningRetriever(service, None, grpc_server, http, metrics_server, settings.shutdown_grace_s,
                            settings.host, f"backend=web provider={w.provider} cache={w.cache.kind}")


async def start_servers(settings: RetrieverSettings, service: RetrieverService):
    """The gRPC server, the HTTP server (unless `http_port` is None) and the metrics server (when
    `metrics_port` is set) over `service`, started; on failure those already started are stopped."""
    grpc_server = GrpcServer(settings.host, settings.grpc_port, token=settings.token,
                             max_message_bytes=settings.max_message_bytes,
                             max_receive_bytes=min(settings.max_message_bytes, settings.limits.request_bytes()))
    grpc_server.add(retriever_pb2_grpc.add_RetrieverServicer_to_server, RetrieverServicer(service), SERVICE_NAME)
    http = metrics_server = None
    try:
        await grpc_server.start()
        if settings.http_port is not None:
            http = HttpServer(create_app(service, token=settings.token, metrics_open=settings.metrics_open),
                              settings.host, settings.http_port, max_body_bytes=settings.limits.request_bytes())
            await http.start()
        if settings.metrics_port is not None:
            closed = settings.token if not settings.metrics_open else None
            metrics_server = start_metrics_server(service.metrics.registry, settings.host, settings.metrics_port,
                                                  token=closed)
    except BaseException:
        await grpc_server.stop(0)
        if http is not None:
            await http.stop()
        raise
    return grpc_server, http, metrics_server


async def serve(settings: RetrieverSettings, *, on_ready: Callable[[RunningRetriever], None] | None = None) -> None:
    """Run until SIGTERM/SIGINT, then drain and exit."""
    if settings.backend == "web":
        running = await start_web_retriever(settings)
    else:
        passive_openmp_waits()  # before the index load imports torch and faiss
        loaded = await asyncio.to_thread(open_index, settings)
        running = await start_retriever(settings, loaded)
    stop = asyncio.Event()
    install_shutdown_signals(stop)
    supervisor = running.supervise(Supervisor("retriever"))
    if on_ready is not None:
        on_ready(running)
    try:
        await supervisor.wait(stop)
        log.info("retriever shutting down (grace %.1fs)", settings.shutdown_grace_s)
    finally:
        await supervisor.close()
        await running.stop()


def run(settings: RetrieverSettings) -> int:
    """`searchr1 serve retriever`: serve until SIGTERM/SIGINT, printing one `retriever ready …` line when
    both servers accept requests; returns the exit code (2: an index or corpus it cannot serve)."""
    import sys

    from searchr1.core.commandline import EXIT_FAILED, EXIT_USAGE, error
    from searchr1.retriever.corpus import CorpusError

    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)

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
    except (IndexMismatchError, CorpusError, FileNotFoundError, ValueError) as exc:
        return error(str(exc))
    except OSError as exc:  # a port it cannot bind (in use), a file it cannot read
        return error(str(exc), EXIT_FAILED if "bind" in str(exc) else EXIT_USAGE)
    except TaskDied as exc:
        return error(str(exc), EXIT_FAILED)
    log.info("retriever stopped")
    return 0
