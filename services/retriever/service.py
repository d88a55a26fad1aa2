"""The retriever's request handling: validation, the shared search path (micro-batcher → corpus rows →
hits), the gRPC servicer and the Search-R1-compatible FastAPI app.

Both APIs go through `RetrieverService.search`, so they batch together and answer identically. The
search runs on the micro-batcher's thread, and the corpus rows are read from the memory map on that same
thread right after it (one thread hop per request), so page faults on a cold corpus never stall the
event loop.

HTTP `POST /retrieve` takes Search-R1's body `{"queries": [...], "topk": 3, "return_scores": true}` and
answers `{"result": [[{"document": {"id", "contents"}, "score"}, …], …]}`, or
`{"result": [[{"id", "contents"}, …], …]}` with `return_scores` false (its default, as in Search-R1).
Departures from Search-R1: a document is always `{"id", "contents"}` (Search-R1 returns the whole
corpus row, which for wiki-18 is exactly that); bad input (no queries, empty or oversize query, topk out of
range) gets HTTP 422 with a message instead of a 500 or an unbounded search.

With a web search backend (`backend = "web"`) the same validation and both APIs front `WebBackend`
instead of the micro-batcher; its run budget spent answers gRPC FAILED_PRECONDITION / HTTP 402 (the
rollout's finish reason `search_budget`), the search API unreachable answers UNAVAILABLE / HTTP 503.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Protocol

import grpc
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError

from searchr1.core.api import retriever_pb2, retriever_pb2_grpc
from searchr1.core.auth import LIVE_PATH, BearerAuthMiddleware, open_paths
from searchr1.core.clients.retriever import Hit
from searchr1.core.protocol import split_contents
from searchr1.retriever.batcher import MicroBatcher, QueueFull
from searchr1.retriever.corpus import Corpus
from searchr1.retriever.metrics import RetrieverMetrics
from searchr1.retriever.settings import LimitSettings
from searchr1.retriever.web.backend import BackendUnavailable
from searchr1.retriever.web.limits import BudgetExhausted

SERVICE_NAME = retriever_pb2.DESCRIPTOR.services_by_name["Retriever"].full_name


class InvalidRequest(ValueError):
    """A request outside the server's bounds; the message says which bound."""


def validate_request(queries: Sequence[str], top_k: int, limits: LimitSettings) -> None:
    """Raise InvalidRequest unless 1 ≤ len(queries) ≤ max_queries, every query is non-blank (unless
    allow_blank_queries) and at most max_query_chars long, and 1 ≤ top_k ≤ max_top_k."""
    if not queries:
        raise InvalidRequest("no queries: send at least one")
    if len(queries) > limits.max_queries:
        raise InvalidRequest(f"{len(queries)} queries in one request; at most {limits.max_queries}")
    if not 1 <= top_k <= limits.max_top_k:
        raise InvalidRequest(f"top_k must be between 1 and {limits.max_top_k}, got {top_k}")
    for i, q in enumerate(queries):
        if not q.strip() and not limits.allow_blank_queries:
            raise InvalidRequest(f"query {i} is empty (set limits.allow_blank_queries to search it)")
        if len(q) > limits.max_query_chars:
            raise InvalidRequest(f"query {i} has {len(q)} characters; at most {limits.max_query_chars}")


class SearchBackend(Protocol):
    """A search backend other than the local index (`searchr1.retriever.web.backend.WebBackend`)."""

    async def search(self, queries: Sequence[str], top_k: int) -> list[list[Hit]]: ...

    async def close(self) -> None: ...


class RetrieverService:
    """Validate, then search: batch, search the index and turn corpus rows into hits, or ask `backend`
    when one is given. Dependencies are passed in."""

    def __init__(self, corpus: Corpus | None, batcher: MicroBatcher | None, limits: LimitSettings,
                 metrics: RetrieverMetrics, *, info: dict[str, Any] | None = None,
                 backend: SearchBackend | None = None) -> None:
        self.corpus = corpus
        self.batcher = batcher
        self.limits = limits
        self.metrics = metrics
        self.info = info or {}
        self.backend = backend

    async def search(self, queries: Sequence[str], top_k: int) -> list[list[Hit]]:
        validate_request(queries, top_k, self.limits)
        if self.backend is not None:
            self.metrics.queries.inc(len(queries))
            return await self.backend.search(queries, top_k)
        return await self.batcher.search(queries, top_k, finish=self.hits)

    def hits(self, ranked: Sequence[Sequence[tuple[int, float]]]) -> list[list[Hit]]:
        """Corpus rows → hits, per query (memory-map reads: blocking, so run on the search thread)."""
        out = []
        for row_scores in ranked:
            query_hits = []
            for row, score in row_scores:
                passage = self.corpus.get(row)
                title, _ = split_contents(passage.contents)
                query_hits.append(Hit(passage.doc_id, title, passage.contents, score))
            out.append(query_hits)
        return out


# ---------------------------------------------------------------------------------------------- gRPC


class RetrieverServicer(retriever_pb2_grpc.RetrieverServicer):
    """gRPC `Search`: INVALID_ARGUMENT for bad input, RESOURCE_EXHAUSTED when the queue is full."""

    def __init__(self, service: RetrieverService) -> None:
        self.service = service

    async def Search(self, request: retriever_pb2.SearchRequest, context: grpc.aio.ServicerContext):
        metrics = self.service.metrics
        t0 = time.perf_counter()

        def record(code: str) -> None:  # before abort(): the client must never see a reply the metrics lack
            metrics.requests.labels("grpc", code).inc()
            metrics.latency.labels("grpc").observe(time.perf_counter() - t0)

        try:
            results = await self.service.search(list(request.queries), int(request.top_k))
        except InvalidRequest as exc:
            record("INVALID_ARGUMENT")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except QueueFull as exc:
            record("RESOURCE_EXHAUSTED")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except BudgetExhausted as exc:
            record("FAILED_PRECONDITION")
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except BackendUnavailable as exc:
            record("UNAVAILABLE")
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception:
            record("INTERNAL")
            raise
        record("OK")
        return retriever_pb2.SearchResponse(results=[
            retriever_pb2.QueryHits(hits=[retriever_pb2.Hit(doc_id=h.doc_id, title=h.title, contents=h.contents,
                                                            score=h.score) for h in hits])
            for hits in results])

    async def Info(self, request: retriever_pb2.InfoRequest, context: grpc.aio.ServicerContext):
        """What this retriever serves (`RetrieverService.info`) as JSON."""
        return retriever_pb2.InfoResponse(json=json.dumps(self.service.info, sort_keys=True, default=str))


# ---------------------------------------------------------------------------------------------- HTTP


class RetrieveRequest(BaseModel):
    """Search-R1's `/retrieve` body."""

    model_config = ConfigDict(extra="ignore")
    queries: list[str]
    """Queries, answered in order."""
    topk: int | None = None
    """Hits per query (None: the server's default_top_k)."""
    return_scores: bool = False
    """True: each hit is {"document": {...}, "score": s}; False: the bare document."""


def format_retrieve_response(results: list[list[Hit]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's response shape (see module docstring)."""
    if return_scores:
        return {"result": [[{"document": {"id": h.doc_id, "contents": h.contents}, "score": h.score} for h in hits]
                           for hits in results]}
    return {"result": [[{"id": h.doc_id, "contents": h.contents} for h in hits] for hits in results]}


def _errors(errors: Sequence[Any]) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors)


def create_app(service: RetrieverService, *, token: str | None, metrics_open: bool):
    """The HTTP API: POST /retrieve, GET /healthz, GET /metrics (ASGI app, wrapped in bearer auth when
    a token is set; `/metrics` without it when `metrics_open`: the retriever's `token` and `metrics_open`)."""
    app = FastAPI(title="searchr1 retriever", docs_url=None, redoc_url=None)
    metrics = service.metrics

    # the body is parsed by hand (whatever the content type); the schema still tells clients its shape
    @app.post("/retrieve", openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": RetrieveRequest.model_json_schema()}}}})
    async def retrieve(request: Request) -> JSONResponse:
        t0 = time.perf_counter()
        code = "OK"
        try:
            # parsed whatever the content type says (Search-R1 clients send JSON, curl users often forget -H)
            try:
                body = RetrieveRequest.model_validate_json(await request.body())
            except ValidationError as exc:
                raise InvalidRequest(f"invalid request body: {_errors(exc.errors())}") from None
            top_k = body.topk if body.topk is not None else service.limits.default_top_k
            results = await service.search(body.queries, top_k)
            return JSONResponse(format_retrieve_response(results, body.return_scores))
        except InvalidRequest as exc:
            code = "INVALID_ARGUMENT"
            raise HTTPException(422, detail=str(exc)) from None
        except QueueFull as exc:
            code = "RESOURCE_EXHAUSTED"
            raise HTTPException(503, detail=str(exc), headers={"Retry-After": "1"}) from None
        except BudgetExhausted as exc:
            code = "FAILED_PRECONDITION"
            raise HTTPException(402, detail=str(exc)) from None
        except BackendUnavailable as exc:
            code = "UNAVAILABLE"
            raise HTTPException(503, detail=str(exc)) from None
        except Exception:
            code = "INTERNAL"
            raise
        finally:
            metrics.requests.labels("http", code).inc()
            metrics.latency.labels("http").observe(time.perf_counter() - t0)

    @app.get(LIVE_PATH)
    async def health() -> dict[str, Any]:
        return {"status": "ok", **service.info}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return BearerAuthMiddleware(app, token, open_paths(metrics_open=metrics_open)) if token else app
