"""The reward service over HTTP (FastAPI): `POST /v1/score`, `GET /v1/scorers`, `GET /healthz`,
`GET /metrics`, optional bearer auth on `/v1/*`. The wire models live in `searchr1.core.clients.reward`
(one definition shared with the client).

`RewardService` holds the dependencies (registry, scoring context with encoder cache / judge / thread
pool, metrics, settings) and does the work, raising domain errors; the routes only hand requests to it,
and the app maps those errors to HTTP: bad input (`ScorerInputError`: unknown scorer, bad params, wrong
item shape, too many items) answers 422 with a message; a judge endpoint that stays down
(`JudgeUnavailable`) answers 502 (the client retries 5xx).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from searchr1.core.auth import LIVE_PATH, BearerAuthMiddleware, open_paths
from searchr1.core.clients.reward import ScoreRequest, ScoreResult
from searchr1.core.servers import HttpServer, install_shutdown_signals
from searchr1.core.supervise import Supervisor, TaskDied
from searchr1.reward.judge import JudgeUnavailable, LLMJudge
from searchr1.reward.metrics import RewardMetrics
from searchr1.reward.registry import Judge, Registry, ScorerInputError, ScoringContext
from searchr1.reward.runner import run_scorer
from searchr1.reward.scorers import default_registry
from searchr1.reward.semantic import EncoderCache
from searchr1.reward.settings import RewardSettings


class RewardService:
    """Scores requests with registered scorers and records metrics."""

    def __init__(self, settings: RewardSettings, ctx: ScoringContext, metrics: RewardMetrics,
                 closers: list[Any] | None = None) -> None:
        self.settings = settings
        self.ctx = ctx
        self.metrics = metrics
        self._closers = closers or []

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """Scores of `request`'s items. Raises `ScorerInputError` for bad input and `JudgeUnavailable`
        when the judge endpoint stays down (the HTTP app answers 422 and 502)."""
        label = request.scorer if request.scorer in self.ctx.registry else "unknown"
        start = time.perf_counter()
        try:
            if len(request.items) > self.settings.max_batch_items:
                raise ScorerInputError(f"{len(request.items)} items exceed this server's max_batch_items "
                                       f"({self.settings.max_batch_items}); split the batch")
            results = await run_scorer(self.ctx, request.scorer, request.items, request.params)
        except ScorerInputError:
            self.metrics.requests.labels(scorer=label, outcome="invalid").inc()
            raise
        except Exception:
            self.metrics.requests.labels(scorer=label, outcome="error").inc()
            raise
        self.metrics.latency.labels(scorer=label).observe(time.perf_counter() - start)
        self.metrics.requests.labels(scorer=label, outcome="ok").inc()
        self.metrics.items.labels(scorer=label).inc(len(results))
        self.metrics.batch.observe(len(results))
        hist = self.metrics.scores.labels(scorer=label)
        for value, _ in results:
            hist.observe(value)
        return ScoreResult(scores=[v for v, _ in results], components=[c for _, c in results])

    def scorers(self) -> list[dict[str, Any]]:
        return self.ctx.registry.describe()

    async def aclose(self) -> None:
        for close in self._closers:
            result = close()
            if asyncio.iscoroutine(result):
                await result


def build_service(settings: RewardSettings, *, registry: Registry | None = None, judge: Judge | None = None,
                  encoder: Any = None, metrics: RewardMetrics | None = None) -> RewardService:
    """Wire a service from settings; tests may pass their own judge, encoder or registry."""
    metrics = metrics or RewardMetrics()
    registry = registry or default_registry()
    for name in settings.scorer_params:
        registry.get(name)  # unknown names in the config fail at start-up, not on the first request
    closers: list[Any] = []
    executor = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="reward-score")
    closers.append(lambda: executor.shutdown(wait=False, cancel_futures=True))
    if judge is None and settings.judge.url:
        llm = LLMJudge(settings.judge.url, settings.judge, on_event=metrics.judge_event)
        closers.append(llm.close)
        judge = llm
    if encoder is None:
        encoder = EncoderCache(settings.embedding)
    ctx = ScoringContext(registry=registry, encoder=encoder, judge=judge, defaults=dict(settings.scorer_params),
                         executor=executor, inline_max_items=settings.inline_max_items)
    service = RewardService(settings, ctx, metrics, closers)
    # validate config defaults once (e.g. a composite's components) so a bad config fails at start-up
    for name, params in settings.scorer_params.items():
        ctx.params_for(name, params)
    return service


router = APIRouter()


def _service(request: Request) -> RewardService:
    return request.app.state.service


@router.post("/v1/score", response_model=ScoreResult)
async def score(body: ScoreRequest, request: Request) -> ScoreResult:
    """Score a batch of items with one scorer; answers are in item order."""
    return await _service(request).score(body)


@router.get("/v1/scorers")
async def scorers(request: Request) -> dict[str, Any]:
    """Registered scorers with their input shape and the JSON schema of their params."""
    return {"scorers": _service(request).scorers()}


@router.get(LIVE_PATH)
async def health(request: Request) -> dict[str, Any]:
    return {"status": "ok", "scorers": len(_service(request).ctx.registry.names())}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(_service(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _flatten(errors: list[dict[str, Any]]) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {err.get('msg', '')}" if loc else str(err.get("msg", "")))
    return "; ".join(parts)


def create_app(service: RewardService) -> FastAPI:
    """The FastAPI app around a built service (closed on shutdown)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await service.aclose()

    app = FastAPI(title="searchr1 reward", version="1", lifespan=lifespan)
    app.state.service = service
    app.include_router(router)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        service.metrics.requests.labels(scorer="unknown", outcome="invalid").inc()
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": _flatten(errors) or "invalid request",
                                                      "errors": errors[:50]})

    @app.exception_handler(ScorerInputError)
    async def _bad_input(request: Request, exc: ScorerInputError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    @app.exception_handler(JudgeUnavailable)
    async def _judge_down(request: Request, exc: JudgeUnavailable) -> JSONResponse:
        return JSONResponse(status_code=502, content={"detail": str(exc)})

    if service.settings.token:
        app.add_middleware(BearerAuthMiddleware, token=service.settings.token,
                           open_paths=open_paths(metrics_open=service.settings.metrics_open))
    return app


async def serve(settings: RewardSettings, *, ready: asyncio.Event | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run the service until SIGINT/SIGTERM (or `stop` is set); prints a ready line once listening. Raises
    `TaskDied` when the HTTP server's serve task ends on its own (the process exits 1, to be restarted)."""
    service = build_service(settings)
    app = create_app(service)
    server = HttpServer(app, settings.host, settings.port, log_level=settings.log_level)
    stop = stop or asyncio.Event()
    install_shutdown_signals(stop)
    await server.start()
    supervisor = Supervisor("reward")
    supervisor.watch("http server", server.task)  # type: ignore[arg-type]  # started above
    print(f"searchr1 reward service ready on {server.url} (scorers: {', '.join(service.ctx.registry.names())})",
          flush=True)
    if ready is not None:
        ready.set()
    try:
        await supervisor.wait(stop)
    finally:
        await supervisor.close()
        await server.stop()
        print("searchr1 reward service stopped", flush=True)


def run(settings: RewardSettings) -> int:
    """`searchr1 serve reward`: serve until SIGINT/SIGTERM; returns the exit code (1: the port or a
    resource could not be had)."""
    from searchr1.core.commandline import EXIT_FAILED, error

    try:
        asyncio.run(serve(settings))
    except (OSError, TaskDied) as exc:
        return error(str(exc), EXIT_FAILED)
    return 0
