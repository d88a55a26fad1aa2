"""Assemble and run a rollout worker from `RolloutSettings`.

Stages, top to bottom: metrics endpoint → engine (vLLM, or the HF fallback) → retriever client +
search batcher → reward client → Redis streams (both consumer groups ensured, so neither side depends
on start order) → weight loader (catch up with the latest announced version before serving) → ready
line → worker loop until SIGTERM/SIGINT → drain → close.

Redis: every Redis call goes through one `RedisLink`, so the worker waits for Redis through an outage
(a restart, an AOF reload) instead of failing; the metrics port's `/readyz` answers 503 while Redis is
away (a PING every second keeps it current) and 200 once it answers again.

Tests and benchmarks pass an already-started `generator` (one vLLM engine per test session).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.core.clients.http_retriever import retriever_client
from searchr1.core.clients.reward import RewardClient
from searchr1.core.commandline import EXIT_FAILED, error
from searchr1.core.faults import NO_FAULTS, Faults
from searchr1.core.metrics import MetricsServer, start_metrics_server
from searchr1.core.models import require_model_dir
from searchr1.core.servers import install_shutdown_signals
from searchr1.core.supervise import Supervisor, TaskDied
from searchr1.core.watchdog import Watchdog
from searchr1.rollout.batcher import SearchBatcher
from searchr1.rollout.engine import Generator, GeneratorDead, HfCodec
from searchr1.rollout.hf_engine import HfGenerator
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.rollout.partial import InterruptibleGenerator
from searchr1.rollout.sampler import GroupSampler
from searchr1.rollout.settings import EngineSettings, RolloutSettings
from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator
from searchr1.rollout.worker import Worker
from searchr1.streams import RedisLink, StreamKeys, connect, tasks_stream, trajectories_stream
from searchr1.weightsync import WEIGHTS_KEY_ENV, WORKER_EXTENSION, WeightLoader

log = logging.getLogger("searchr1.rollout")


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def start_generator(model: str, engine: EngineSettings) -> Generator:
    """Start the configured engine on `model` (a local model directory: `ModelDirError`, a ValueError,
    names a missing one at once)."""
    if not model:
        raise ValueError("no model configured: pass --model DIR (or ROLLOUT_MODEL)")
    require_model_dir(model)
    if engine.kind == "hf":
        return HfGenerator(model, threads=engine.hf_threads)
    return await VllmGenerator.start(VllmEngineConfig(
        model=model, engine=engine,
        extra={"worker_extension_cls": WORKER_EXTENSION},  # receives `broadcast://` weight versions
    ))


@dataclass
class RolloutService:
    """A wired worker and everything it must close."""

    settings: RolloutSettings
    worker: Worker
    metrics: RolloutMetrics
    metrics_server: MetricsServer | None
    generator: Generator
    owns_generator: bool
    closers: list[Callable[[], Any]]
    link: RedisLink | None = None

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_server is None:
            return None
        return f"http://{self.settings.metrics_host}:{self.metrics_server.port}/metrics"

    async def run(self, stop: asyncio.Event) -> None:
        """The worker loop until `stop`, beside its Redis watch, metrics server and progress watchdog, all
        supervised: a death of any (the watchdog's when the loop made no pass for `tasks.stall_timeout_s`)
        stops the worker (drained) with `TaskDied`."""
        supervisor = Supervisor("rollout")
        if self.metrics_server is not None:
            supervisor.bind()
            self.metrics_server.on_death = supervisor.fail
        if self.link is not None:  # ends when `stop` is set
            supervisor.spawn("redis watch", self.link.watch(self.worker.tasks.redis, stop), may_finish=True)
        if self.worker.watchdog is not None:  # a loop that stopped passing stops the worker, not only /healthz
            supervisor.spawn("progress watchdog", self.worker.watchdog.guard())
        try:
            await supervisor.run(self.worker.run(stop), stop, grace_s=(self.worker.settings.drain_timeout_s or 60.0) + 30.0)
        finally:
            await supervisor.close(timeout=5.0)

    async def close(self) -> None:
        for close in reversed(self.closers):
            result = close()
            if asyncio.iscoroutine(result):
                await result
        if self.metrics_server is not None:
            self.metrics_server.close()
        if self.owns_generator:
            await self.generator.close()


def _counted(metrics: RolloutMetrics, dependency: str) -> dict[str, Callable[[Any], None]]:
    """A client's `on_retry` / `on_give_up` hooks counting into the dependency's metrics."""
    return {"on_retry": lambda exc: metrics.dependency_retries.labels(dependency).inc(),
            "on_give_up": lambda reason: metrics.dependency_failures.labels(dependency).inc()}


async def build_service(settings: RolloutSettings, *, generator: Generator | None = None,
                        tokenizer: Any = None, serve_metrics: bool = True, faults: Faults = NO_FAULTS) -> RolloutService:
    """Wire a worker from settings (pass `generator` + `tokenizer` to share an engine; `faults`: the fault
    suite's hook)."""
    metrics = RolloutMetrics()
    link = RedisLink("rollout", **metrics.redis.link_callbacks())
    watchdog = Watchdog("rollout", settings.tasks.stall_timeout_s, excused=lambda: not link.up)
    metrics_server = (start_metrics_server(metrics.registry, settings.metrics_host, settings.metrics_port,
                                           ready=lambda: link.up, live=watchdog.alive,
                                           token=None if settings.metrics_open else settings.token)
                      if serve_metrics else None)
    closers: list[Callable[[], Any]] = []
    owns = generator is None
    try:
        if generator is None:
            # the engine's workers check each broadcast version's signature with the run's weight token
            os.environ[WEIGHTS_KEY_ENV] = settings.weights.token or ""
            generator = await start_generator(settings.model, settings.engine)
        if tokenizer is None:
            tokenizer = generator.tokenizer()  # type: ignore[attr-defined]
        r = settings.retriever
        retriever = retriever_client(r.addresses, token=r.token, retry=r.retry_policy(),
                                     **_counted(metrics, "retriever"))
        closers.append(retriever.close)

        def on_batch(n: int, seconds: float) -> None:
            metrics.search_batch_size.observe(n)
            metrics.search_latency.observe(seconds)

        batcher = SearchBatcher(retriever, r, on_batch=on_batch)
        w = settings.reward
        reward = RewardClient(w.url, token=w.token, retry=w.retry_policy(), **_counted(metrics, "reward"))
        closers.append(reward.close)
        redis = connect(settings.redis.url)
        closers.append(redis.aclose)
        keys = StreamKeys(settings.redis.run)
        t = settings.tasks
        tasks = tasks_stream(redis, keys, visibility_timeout_ms=t.visibility_timeout_ms,
                             max_deliveries=t.max_deliveries, trim_every=t.trim_acked_every, link=link)
        groups = trajectories_stream(redis, keys, trim_every=t.trim_acked_every, link=link)
        loader = WeightLoader(redis, keys, generator, Path(settings.weights.download_dir),
                              version=settings.initial_version, token=settings.weights.token, link=link,
                              faults=faults, **metrics.loader_callbacks())
        metrics.weight_version.set(loader.version)
        await loader.maybe_update()
        worker_id = settings.worker_id or default_worker_id()
        partial = (InterruptibleGenerator(generator, loader.version, on_interrupt=metrics.turns_interrupted.inc)
                   if settings.weights.partial_rollouts else None)
        sampler = GroupSampler(partial or generator, HfCodec(tokenizer), tokenizer, batcher.search, reward, settings.agent,
                               settings.reward, metrics, max_context_tokens=settings.engine.max_model_len)
        worker = Worker(sampler, tasks, groups, loader, metrics, worker_id, t, settings.weights,
                        heartbeat_s=t.visibility_timeout_ms / 4000, watchdog=watchdog, partial=partial,
                        faults=faults)
    except BaseException:
        for close in reversed(closers):
            result = close()
            if asyncio.iscoroutine(result):
                await result
        if metrics_server is not None:
            metrics_server.close()
        if owns and generator is not None:
            await generator.close()
        raise
    return RolloutService(settings, worker, metrics, metrics_server, generator, owns, closers, link)


async def serve(settings: RolloutSettings, *, on_ready: Callable[[RolloutService], None] | None = None,
                faults: Faults = NO_FAULTS) -> None:
    """Run a worker until SIGTERM/SIGINT, then drain (finish, publish and ack in-flight tasks) and exit."""
    service = await build_service(settings, faults=faults)
    stop = asyncio.Event()
    install_shutdown_signals(stop)
    if on_ready is not None:
        on_ready(service)
    try:
        await service.run(stop)
        log.info("rollout worker %s drained; exiting", service.worker.worker_id)
    finally:
        await service.close()


def run(settings: RolloutSettings, faults: Faults = NO_FAULTS) -> int:
    """`searchr1 serve rollout`: serve until SIGTERM/SIGINT (then drain) and return the exit code: 1 when
    the engine died (a restart gets the held tasks redelivered) or a resource failed, else 0. `faults`:
    the fault suite's hook (armed from the environment by the command)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def ready(service: RolloutService) -> None:
        log.info("rollout worker %s ready: run=%s model=%s version=%d metrics=%s", service.worker.worker_id,
                 settings.redis.run, settings.model, service.worker.loader.version, service.metrics_url)

    try:
        asyncio.run(serve(settings, on_ready=ready, faults=faults))
    except GeneratorDead as exc:
        return error(f"{exc}; exiting for a restart (the tasks held are redelivered)", EXIT_FAILED)
    except TaskDied as exc:
        return error(str(exc), EXIT_FAILED)
    except (OSError, ValueError) as exc:
        return error(str(exc), EXIT_FAILED)
    return 0
