"""The learner as a process: `run_learner` (what `searchr1 train` runs) takes the run's lease (rank 0),
opens Redis and its link, loads the models, opens the step log, archive and dispatch record, serves the
metrics, has `compose.build_learner` wire one `Learner` loop (`service.py`) from them, runs it, and tears
everything down; `run_replay` runs the same loop over an archive (`train --replay`).

On rank 0 a progress watchdog (`core/watchdog.py`, `stall_timeout_s`) is beaten by progress only (the
start done, a step trained, a checkpoint's bytes written): once it stalls, `/healthz` answers 503, the
lease is no longer renewed and the process stops naming what the loop waited for. The lease keeper and the
watchdog run supervised (`core/supervise.py`): a lease lost, or a stall, stops the process with its cause
(exit 3 for the lease, else 1), to be restarted. The dataset is read before the model loads, so a row the
wire refuses stops the start at once (exit 2, which `searchr1 up` does not restart).

Across nodes (torchrun `--nnodes` > 1) every node serves `/healthz`, so one liveness probe fits every pod
of the learner: on node 0, global rank 0's (the whole learner's progress: every step is a collective, so
a rank stuck anywhere stalls rank 0); on another node, its local rank 0's, whose watchdog is beaten by
each step it trains and excuses its wait for rank 0's next step (rank 0's watchdog bounds that wait), so
it fails when that node's ranks are stuck in their own part of a step. Those nodes have no lease, no
Redis and no figures: their `/readyz` is always 200 and nothing scrapes their `/metrics`.
"""

from __future__ import annotations

import asyncio
import os

from searchr1.core.datasets import Question
from searchr1.core.faults import NO_FAULTS, Faults
from searchr1.core.redaction import redact_config
from searchr1.core.supervise import Supervisor
from searchr1.core.watchdog import Watchdog
from searchr1.learner.compose import build_learner
from searchr1.learner.metrics import LearnerMetrics, StepLog
from searchr1.learner.parts import NO_ARCHIVE, NO_STEP_LOG, NO_WATCHDOG, Outputs, RedisSide, WatchdogLike
from searchr1.learner.redis_budget import enforce_redis_budget
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.archive import ArchiveSource
from searchr1.learner.tools.archive import ArchiveWriter
from searchr1.learner.train.build import build_training
from searchr1.learner.train.checkpoint import TrainState
from searchr1.learner.train.distributed import init_distributed
from searchr1.learner.train.model import DistInfo
from searchr1.streams import Lease, RedisLink

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
    metrics = LearnerMetrics()
    training = await asyncio.to_thread(build_training, settings, DistInfo(), metrics.stages)
    learner = build_learner(settings, training, metrics=metrics,
                            outputs=Outputs(StepLog(settings.log_dir / f"{settings.redis.run}.jsonl")),
                            source=ArchiveSource(settings.archive.replay_from))
    await learner.start()
    return await learner.run(stop, max_steps=max_steps)


async def run_learner(settings: LearnerSettings, stop: asyncio.Event | None = None,
                      max_steps: int | None = None, faults: Faults = NO_FAULTS) -> TrainState:
    """Everything `searchr1 train` does: the run's lease (rank 0; `LeaseHeld` when another learner holds
    it past one TTL), models, Redis, dispatcher, weight server, metrics, loop. `faults`: the fault suite's
    hook (armed from the environment by the command)."""
    from searchr1.core.servers import install_shutdown_signals
    from searchr1.learner.train.fences import highest_token
    from searchr1.streams import connect, default_holder

    if settings.archive.replay_from is not None:
        return await run_replay(settings, stop, max_steps)
    info = init_distributed()
    stop = stop or asyncio.Event()
    install_shutdown_signals(stop)
    if not info.is_main:  # no lease, no Redis; the node's own progress (the module docstring)
        return await _run(settings, info, stop, max_steps, None, LearnerMetrics(),
                          Watchdog("learner", settings.stall_timeout_s), faults)
    # one learner per run: a second one refuses here, before it loads a model
    redis = connect(settings.redis.url)
    lease = Lease(redis, settings.redis.run, ttl_ms=settings.lease_ttl_ms,
                  holder=f"{default_holder()}/{settings.consumer}")
    metrics = LearnerMetrics()
    link = RedisLink("learner", **metrics.redis.link_callbacks())
    # progress, not mere life: a loop that makes none stops renewing the lease, answers 503 on /healthz and
    # stops the process naming what it waited for
    watchdog = Watchdog("learner", settings.stall_timeout_s, excused=lambda: not link.up)
    metrics.watch_progress(watchdog.stalled_for, settings.stall_timeout_s)
    done = asyncio.Event()
    tasks = Supervisor("learner")
    try:
        # a token above every one on disk: Redis losing its counter cannot hand a used one out again
        floor = await asyncio.to_thread(highest_token, settings.checkpoint.dir)
        await lease.acquire(wait_s=settings.lease_ttl_ms / 1000, floor=floor)
        await enforce_redis_budget(settings, redis)  # RedisBudgetError: Redis cannot hold what is kept unacked
        # renewed from here on, through the model's loading, while the loop makes progress; a lease lost
        # stops the process at once (a learner without it can write nothing)
        tasks.spawn("lease keeper", _keep(lease, done, watchdog), may_finish=True)
        tasks.spawn("progress watchdog", watchdog.guard())
        side = RedisSide(redis, lease, link)
        return await tasks.run(_run(settings, info, stop, max_steps, side, metrics, watchdog, faults), stop,
                               grace_s=settings.stall_timeout_s)
    finally:
        done.set()
        await tasks.close(timeout=5.0)
        await lease.release_quietly()
        await redis.aclose()


async def _keep(lease: Lease, done: asyncio.Event, watchdog: Watchdog) -> None:
    """Renew the lease until `done`; raise `LeaseLost` when it was lost first."""
    from searchr1.streams import LeaseLost

    await lease.keep(done, alive=watchdog.alive)
    if not done.is_set() and lease.lost is not None:
        raise LeaseLost(lease.lost)


async def _run(settings: LearnerSettings, info: DistInfo, stop: asyncio.Event, max_steps: int | None,
               redis: RedisSide | None, metrics: LearnerMetrics, watchdog: WatchdogLike = NO_WATCHDOG,
               faults: Faults = NO_FAULTS) -> TrainState:
    """`run_learner` once the run's lease is held (rank 0: `redis`, with its link, and a progress watchdog)
    or on the other ranks (no Redis; each node's local rank 0 serves that node's `/healthz`): the models,
    the outputs, the dataset and the metrics server around the loop `build_learner` wires."""
    from searchr1.core.metrics import start_metrics_server
    from searchr1.learner.tools.data import load_tasks, oversample
    from searchr1.learner.tools.dispatch_log import DispatchLog, dispatch_log_path

    specs: list[Question] = []
    if info.is_main and settings.dispatcher.enabled and settings.dispatcher.dataset:
        # the dataset before the model: a row the wire refuses stops the start (exit 2) in seconds
        specs = await asyncio.to_thread(
            lambda: oversample(load_tasks(settings.dispatcher.dataset), settings.dispatcher.source_repeats))
    training = await asyncio.to_thread(build_training, settings, info, metrics.stages)
    step_log, archive, metrics_server, dispatch_log = NO_STEP_LOG, NO_ARCHIVE, None, None
    if info.is_main:
        from searchr1.core.tracking import TensorBoardLog, WandbLog

        sinks: list = []
        if settings.tensorboard_dir is not None:
            sinks.append(TensorBoardLog(settings.tensorboard_dir))
        if settings.wandb_project:
            sinks.append(WandbLog(settings.wandb_project, name=settings.redis.run, mode=settings.wandb_mode,
                                  dir=settings.log_dir, config=redact_config(settings.model_dump(mode="json"))))
        step_log = StepLog(settings.log_dir / f"{settings.redis.run}.jsonl", *sinks)
        if settings.archive.enabled:
            archive = await asyncio.to_thread(ArchiveWriter, settings.archive_dir, settings.archive.every_steps)
    link = redis.link if redis is not None else None
    if settings.metrics_port is not None and (info.is_main or os.environ.get("LOCAL_RANK") == "0"):
        metrics_server = start_metrics_server(metrics.registry, host=settings.metrics_host,
                                              port=settings.metrics_port, ready=lambda: link is None or link.up,
                                              live=watchdog.alive,
                                              token=None if settings.metrics_open else settings.token)
    learner = None
    try:
        if specs:
            dispatch_log = DispatchLog(dispatch_log_path(settings.log_dir, settings.redis.run))
        outputs = Outputs(step_log, archive, dispatch_log.record if dispatch_log is not None else None)
        learner = build_learner(settings, training, info=info, metrics=metrics, redis=redis, outputs=outputs,
                                watchdog=watchdog, tasks=specs, faults=faults)
        if isinstance(watchdog, Watchdog):  # the process's own: a stall names what the loop was doing
            watchdog.describe = learner.doing
        await learner.weights.open()
        await learner.start()
        return await learner.run(stop, max_steps=max_steps)
    finally:
        if dispatch_log is not None:
            dispatch_log.close()
        if learner is not None:
            await learner.weights.close()
        if metrics_server is not None:
            metrics_server.close()
