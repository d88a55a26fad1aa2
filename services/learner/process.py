"""The learner as a process: `run_learner` (what `searchr1 train` runs) takes the run's lease (rank 0),
builds the models, Redis link, dispatcher, weight server and metrics server around one `Learner` loop
(`service.py`), and tears them down; `run_replay` runs the same loop over an archive (`train --replay`).
"""

from __future__ import annotations

import asyncio
import os

from searchr1.core.aio import stop_task
from searchr1.core.lease import Lease
from searchr1.core.redaction import redact_config
from searchr1.core.redis_link import RedisLink
from searchr1.core.watchdog import Watchdog
from searchr1.learner.metrics import LearnerMetrics, StepLog
from searchr1.learner.publisher import WeightPublisher
from searchr1.learner.service import Learner
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.archive import ArchiveSource
from searchr1.learner.tools.archive import ArchiveWriter
from searchr1.learner.train.build import build_training
from searchr1.learner.train.checkpoint import Checkpointer, TrainState
from searchr1.learner.train.distributed import init_distributed
from searchr1.learner.train.model import DistInfo

__all__ = ["run_learner", "run_replay"]


async def run_replay(settings: LearnerSettings, stop: asyncio.Event | None = None,
                     max_steps: int | None = None) -> TrainState:
    """`searchr1 train --replay`: the loop over `settings.archive.replay_from` (an `ArchiveSource`) until
    its last step, `max_steps` (default `optim.total_steps`) or `stop`. No Redis, no dispatcher, no
    archive of its own; one process."""
    from searchr1.core.servers import install_shutdown_signals

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("replay from an archive runs in one process: start it without torchrun")
    if settings.archive.replay_from is None:
        raise ValueError("archive.replay_from is not set")
    stop = stop or asyncio.Event()
    install_shutdown_signals(stop)
    info = DistInfo()
    training = await asyncio.to_thread(build_training, settings, info)
    learner = Learner(settings, training, Checkpointer(settings.checkpoint.dir, settings.checkpoint.keep, info),
                      WeightPublisher(settings.weights.dir, keep=settings.weights.keep), LearnerMetrics(),
                      StepLog(settings.log_dir / f"{settings.redis.run}.jsonl"), info=info,
                      source=ArchiveSource(settings.archive.replay_from))
    await learner.start()
    return await learner.run(stop, max_steps=max_steps)


async def run_learner(settings: LearnerSettings, stop: asyncio.Event | None = None,
                      max_steps: int | None = None) -> TrainState:
    """Everything `searchr1 train` does: the run's lease (rank 0; `LeaseHeld` when another learner holds
    it past one TTL), models, Redis, dispatcher, weight server, metrics, loop."""
    from searchr1.core.lease import default_holder
    from searchr1.core.servers import install_shutdown_signals
    from searchr1.core.streams import connect

    if settings.archive.replay_from is not None:
        return await run_replay(settings, stop, max_steps)
    info = init_distributed()
    stop = stop or asyncio.Event()
    install_shutdown_signals(stop)
    if not info.is_main:
        return await _run(settings, info, stop, max_steps, None, None, LearnerMetrics())
    # one learner per run: a second one refuses here, before it loads a model
    redis = connect(settings.redis.url)
    lease = Lease(redis, settings.redis.run, ttl_ms=settings.lease_ttl_ms,
                  holder=f"{default_holder()}/{settings.consumer}")
    metrics = LearnerMetrics()
    link = RedisLink("learner", **metrics.redis.link_callbacks())
    # progress, not mere life: a hung loop stops renewing the lease and answers 503 on /healthz
    watchdog = Watchdog("learner", settings.stall_timeout_s, excused=lambda: not link.up)
    done = asyncio.Event()
    keeper = None
    try:
        await lease.acquire(wait_s=settings.lease_ttl_ms / 1000)
        # renewed from here on, through the model's loading, while the loop makes progress
        keeper = asyncio.create_task(lease.keep(done, alive=watchdog.alive))
        return await _run(settings, info, stop, max_steps, redis, lease, metrics, link, watchdog)
    finally:
        done.set()
        if keeper is not None:
            await stop_task(keeper, timeout=5.0)
        await lease.release_quietly()
        await redis.aclose()


async def _run(settings: LearnerSettings, info: DistInfo, stop: asyncio.Event, max_steps: int | None,
               redis, lease: Lease | None, metrics: LearnerMetrics, link: RedisLink | None = None,
               watchdog: Watchdog | None = None) -> TrainState:
    """`run_learner` once the run's lease is held (rank 0: with its Redis link and progress watchdog) or on
    the other ranks (no Redis)."""
    from searchr1.core.metrics import start_metrics_server
    from searchr1.core.servers import HttpServer
    from searchr1.learner.dispatcher import Dispatcher
    from searchr1.learner.publisher import weights_app
    from searchr1.learner.tools.data import load_tasks, oversample
    from searchr1.learner.tools.dispatch_log import DispatchLog, dispatch_log_path

    training = await asyncio.to_thread(build_training, settings, info)
    publisher = WeightPublisher(settings.weights.dir, keep=settings.weights.keep)
    step_log = None
    http = metrics_server = None
    if info.is_main:
        wandb_run = None
        if settings.wandb_project:
            import wandb  # optional

            wandb_run = wandb.init(project=settings.wandb_project, name=settings.redis.run,
                                   config=redact_config(settings.model_dump(mode="json")))
        step_log = StepLog(settings.log_dir / f"{settings.redis.run}.jsonl", wandb_run)
        if settings.weights.http:
            http = HttpServer(weights_app(publisher, token=settings.weights.token), settings.weights.host,
                              settings.weights.port)
            await http.start()
            publisher.base_url = f"http://{settings.weights.public_host or settings.weights.host}:{http.port}"
        if settings.metrics_port is not None:
            metrics_server = start_metrics_server(metrics.registry, host=settings.metrics_host,
                                                  port=settings.metrics_port, ready=lambda: link is None or link.up,
                                                  live=None if watchdog is None else watchdog.alive,
                                                  token=None if settings.metrics_open else settings.token)
    archive = None
    if info.is_main and settings.archive.enabled:
        archive = await asyncio.to_thread(ArchiveWriter, settings.archive_dir, settings.archive.every_steps)
    checkpointer = Checkpointer(settings.checkpoint.dir, settings.checkpoint.keep, info, lease=lease)
    learner = Learner(settings, training, checkpointer, publisher, metrics, step_log, redis=redis, info=info,
                      archive=archive, link=link, lease=lease, watchdog=watchdog)
    if info.is_main and settings.weights.transport != "snapshot":
        from searchr1.learner.transport import build_transport

        learner.transport = build_transport(settings.weights, publisher, redis, learner.keys, link, lease)
    dispatch_log = None
    try:
        state = await learner.start()
        dispatcher = None
        if info.is_main and settings.dispatcher.enabled and settings.dispatcher.dataset:
            pos = state.dispatcher or {}
            dispatch_log = DispatchLog(dispatch_log_path(settings.log_dir, settings.redis.run))
            specs = oversample(load_tasks(settings.dispatcher.dataset), settings.dispatcher.source_repeats)
            dispatcher = Dispatcher(learner.tasks, specs, settings.dispatcher,
                                    epoch=pos.get("epoch", 0), cursor=pos.get("cursor", 0),
                                    on_publish=metrics.tasks.inc, staleness=learner.staleness,
                                    version=state.version, downstream=learner.source.trajectories,
                                    vocab_size=training.vocab_size(), record=dispatch_log.record)
        return await learner.run(stop, max_steps=max_steps, dispatcher=dispatcher)
    finally:
        if dispatch_log is not None:
            dispatch_log.close()
        if learner.transport is not None:
            learner.transport.close()
        if http is not None:
            await http.stop()
        if metrics_server is not None:
            metrics_server.close()
