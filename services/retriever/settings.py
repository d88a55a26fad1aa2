"""Settings of the retriever server (`RetrieverSettings`, env prefix `RETRIEVER_`, run-config table
`[retriever]`). Loaded with `searchr1.core.settings.load_settings`; CLI flags override env and file.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from searchr1.core.settings import AuthSettings, Section, ServiceSettings
from searchr1.retriever.web.settings import WebSettings


class LimitSettings(Section):
    """Bounds on one request; beyond them the request is refused (INVALID_ARGUMENT / HTTP 422)."""

    max_queries: int = Field(default=512, ge=1, le=100_000)
    """Most queries in one request."""
    max_query_chars: int = Field(default=4096, ge=1, le=1_000_000)
    """Longest query, in characters."""
    max_top_k: int = Field(default=100, ge=1, le=10_000)
    """Largest top_k."""
    default_top_k: int = Field(default=3, ge=1, le=10_000)
    """top_k for HTTP requests that send none (Search-R1's default retrieval_topk is 3)."""
    allow_blank_queries: bool = False
    """Search empty/blank queries as Search-R1 does (dense: the encoding of ""; BM25: no hits) instead of
    refusing the request (the proto's contract, hence the default)."""
    max_queue_queries: int = Field(default=8192, ge=1, le=10_000_000)
    """Queries allowed to wait for a batch; beyond it requests get RESOURCE_EXHAUSTED / HTTP 503."""

    def request_bytes(self) -> int:
        """The most bytes a request within these bounds can take, JSON-escaped (6 bytes a character at
        worst, `\\uXXXX`), plus room for the envelope: the gRPC receive limit and the HTTP body limit."""
        return self.max_queries * (self.max_query_chars * 6 + 16) + 64 * 1024


class BatchSettings(Section):
    """Micro-batching: concurrent requests are merged into one encode + one index search."""

    max_queries: int = Field(default=128, ge=1, le=100_000)
    """Most queries in one micro-batch (a single larger request still runs whole)."""
    max_wait_ms: float = Field(default=0.0, ge=0.0, le=1000.0)
    """How long a batch with room left waits for more requests after taking all that are queued (0: no
    wait; requests that arrive while a batch runs form the next one, so batches grow with the load)."""
    refill_share: float = Field(default=0.25, ge=0.0, le=10.0)
    """A batch smaller than the previous one waits up to this share of the previous batch's search time
    for the previous batch's callers to come back (0: never; keeps N closed-loop clients in one batch
    instead of a lone request and the other N-1). A lone client never waits."""


class SearchSettings(Section):
    """Search-time index parameters and the dense encoder's runtime."""

    hnsw_ef_search: int = Field(default=128, ge=1, le=100_000)
    """HNSW efSearch."""
    ivf_nprobe: int = Field(default=64, ge=1, le=1_000_000)
    """IVF-PQ cells probed per query."""
    device: str = "cpu"
    """Torch device of the query encoder (cpu, cuda, cuda:1…)."""
    faiss_gpu: bool = False
    """Shard the FAISS index over all visible GPUs (needs a faiss-gpu build; HNSW stays on CPU)."""
    faiss_mmap: bool = False
    """Memory-map the FAISS index file read-only instead of loading it (for a Flat index larger than RAM;
    searches then read pages from disk; ignored with faiss_gpu)."""
    fp16: bool = False
    """Half precision on CUDA."""
    encoder_batch_size: int = Field(default=128, ge=1, le=65_536)
    """Queries per encoder forward pass."""
    encoder_trace: bool = True
    """Run the query encoder as a frozen TorchScript trace, checked against the eager model at load (dropped
    with a warning on any difference): the same vectors for ~20% less CPU per one-query encode on MiniLM."""
    hybrid_with: Path | None = None
    """A second index directory (same corpus) to fuse with by reciprocal-rank fusion."""
    rrf_k: float = Field(default=60.0, gt=0.0)
    """RRF constant: score = sum 1/(rrf_k + rank)."""
    hybrid_depth: int = Field(default=50, ge=1, le=10_000)
    """Candidates each side contributes to the fusion."""
    rerank_model: str | None = None
    """Local path of a sentence-transformers CrossEncoder to rerank with (None: no reranking)."""
    rerank_depth: int = Field(default=20, ge=1, le=10_000)
    """Candidates handed to the reranker per query."""


class RetrieverSettings(ServiceSettings):
    """The retriever server."""

    model_config = SettingsConfigDict(env_prefix="RETRIEVER_")
    section: ClassVar[str] = "retriever"

    backend: Literal["local", "web"] = "local"
    """What answers searches: `local` (the index below) or `web` (a web search API, `[retriever.web]`)."""
    index: Path | None = None
    """Index directory written by `searchr1 index build` (required to serve with the local backend)."""
    corpus: Path | None = None
    """Corpus JSONL, when it moved since the build (default: the path in the manifest)."""
    full_checksum: bool = False
    """Hash the whole corpus at start-up instead of the quick fingerprint (slow on wiki-18)."""
    host: str = "127.0.0.1"
    """Interface both servers bind."""
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    """gRPC port (0: any free port)."""
    http_port: int | None = Field(default=8000, ge=0, le=65535)
    """Search-R1-compatible HTTP port (0: any free port; None: no HTTP server)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Separate Prometheus port; /metrics is also served on the HTTP port."""
    token: str | None = None
    """Bearer token both APIs require (health stays open; metrics too unless `metrics_open` is False). None:
    no auth."""
    metrics_open: bool = True
    """With a token set: False makes /metrics require it too (on the HTTP port and on `metrics_port`)."""
    auth: AuthSettings = Field(default_factory=AuthSettings)
    """An empty `token` refuses to start unless `auth.insecure_no_auth` is on."""
    torch_threads: int = Field(default=1, ge=1, le=1024)
    """torch intra-op threads for the query encoder on batches below `batch_threads_from` queries."""
    faiss_threads: int = Field(default=1, ge=1, le=1024)
    """FAISS OpenMP threads on batches below `batch_threads_from` queries (also BM25 threads)."""
    batch_threads: int = Field(default=0, ge=0, le=1024)
    """torch and FAISS threads for batches of `batch_threads_from` queries or more (0: every core this
    process may use)."""
    batch_threads_from: int = Field(default=16, ge=1, le=100_000)
    """Batch size (queries) from which `batch_threads` are used: a small batch is too small to split."""
    faiss_blas_threshold: int = Field(default=20, ge=1)
    """faiss.cvar.distance_compute_blas_threshold for batches of `faiss_blas_from` queries or more (FAISS
    takes BLAS when the query count or the index size reaches it; its default 128000 in effect never)."""
    faiss_blas_from: int = Field(default=4, ge=1, le=100_000)
    """Batch size (queries) from which a Flat search may use BLAS; smaller batches keep FAISS's default
    (one query is ~3× cheaper on FAISS's own loop than through a BLAS product)."""
    max_message_bytes: int = Field(default=64 << 20, ge=1 << 16)
    """gRPC message size limit."""
    shutdown_grace_s: float = Field(default=5.0, ge=0.0, le=600.0)
    """How long in-flight requests may finish on SIGTERM."""
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    """The server's event loop: `auto` takes uvloop when it is installed (less event-loop CPU per request:
    docs/performance.md, "Retriever"), else asyncio's; `uvloop` requires it."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level."""
    limits: LimitSettings = LimitSettings()
    """Request bounds."""
    batch: BatchSettings = BatchSettings()
    """Micro-batching."""
    search: SearchSettings = SearchSettings()
    """Index and encoder runtime parameters."""
    web: WebSettings = WebSettings()
    """The web search backend (used with `backend = "web"`)."""
