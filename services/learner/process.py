"""The learner as a process: `run_learner` (what `searchr1 train` runs) takes the run's lease (rank 0),
builds the models, Redis link, dispatcher, weight server and metrics server around one `Learner` loop
(`service.py`), and tears them down; `run_replay` runs the same loop over an archive (`train --replay`).

`build_learner` is the composition root: it constructs every collaborator of the loop in dependency order
— checkpointer and weight publisher fenced by the lease, Redis link, streams (the trajectories stream's
acks fenced by the lease inside Redis), staleness policy, dispatcher, group source, weight transport
(its recovery-snapshot record fenced the same way), collapse guard — each with what it needs, and hands
them to `Learner`. On rank 0 a progress watchdog (`core/watchdog.py`, `stall_timeout_s`) is beaten by progress
only (a step trained, the start done, a checkpoint's bytes written): once it stalls, `/healthz` answers
503, the lease is no longer renewed and the process stops naming what the loop waited for. The lease
keeper and the watchdog run supervised (`core/supervise.py`): a lease lost, or a stall, stops the process
with its cause (exit 1, or 3 for the lease), to be restarted. The dataset is read before the model loads,
so a row the wire refuses stops the start at once (exit 2, which `searchr1 up` does not restart).

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
from collections.abc import Callable, Sequence
from typing import Any

from searchr1.core.datasets import Question
from searchr1.core.faults import NO_FAULTS, Faults
from searchr1.core.redaction import redact_config
from searchr1.core.supervise import Supervisor
from searchr1.core.watchdog import Watchdog
from searchr1.learner.algo.desync import DesyncPolicy
from searchr1.learner.algo.staleness import StalenessPolicy
from searchr1.learner.dispatcher import Dispatcher
from searchr1.learner.guard import CollapseGuard
from searchr1.learner.metrics import LearnerMetrics, StepLog
from searchr1.learner.redis_budget import enforce_redis_budget
from searchr1.learner.service import Learner
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.archive import ArchiveSource
from searchr1.learner.sources.base import GroupSource
from searchr1.learner.sources.stream import StreamSource
from searchr1.learner.tools.archive import ArchiveWriter
from searchr1.learner.tools.dead_tasks import DeadTasks, dead_tasks_path
from searchr1.learner.train.build import Training, build_training
from searchr1.learner.train.checkpoint import Checkpointer, TrainState
from searchr1.learner.train.distributed import init_distributed
from searchr1.learner.train.model import DistInfo
from searchr1.streams import Lease, RedisLink, StreamKeys, tasks_stream, trajectories_stream
from searchr1.weightsync import WeightPublisher, WeightTransport, build_transport

__all__ = ["build_learner", "run_learner", "run_replay"]


def build_learner(
    settings: LearnerSettings,
    training: Training,
    *,
    info: DistInfo | None = None,
    metrics: LearnerMetrics | None = None,
    step_log: StepLog | None = None,
    redis: Any = None,
    lease: Lease | None = None,
    link: RedisLink | None = None,
    publisher: WeightPublisher | None = None,
    base_url: str | None = None,
    archive: ArchiveWriter | None = None,
    source: GroupSource | None = None,
    tasks: Sequence[Question] = (),
    record: Callable[[list[str]], None] | None = None,
    dispatcher: Dispatcher | None = None,
    transport: WeightTransport | None = None,
    watchdog: Watchdog | None = None,
    faults: Faults = NO_FAULTS,
) -> Learner:
    """The learner loop and every collaborator it needs, built in dependency order. With `redis` (rank 0
    of a live run) the group source is the trajectories stream (unless `source` is given) and, given
    `tasks`, a dispatcher feeds the tasks stream (`record`: its durable dispatch record); without, the
    snapshots are written and not announced. `lease` fences the checkpointer, the publisher and every
    write (acks and the recovery-snapshot record inside Redis); `watchdog` is beaten by the loop and the
    source's reads; `training` is `build_training`'s (its trainer timed on `metrics.stages`); `faults` is
    the fault suite's hook (the loop's and the checkpointer's points)."""
    info = info or DistInfo()
    metrics = metrics or LearnerMetrics()
    keys = StreamKeys(settings.redis.run)
    fence, check = (lease.token, lease.check) if lease is not None else (0, None)
    checkpointer = Checkpointer(settings.checkpoint.dir, settings.checkpoint.keep, info, lease=lease, faults=faults)
    if publisher is None:
        publisher = WeightPublisher(settings.weights.dir, keep=settings.weights.keep, base_url=base_url,
                                    fence=fence, guard=check)
    staleness = StalenessPolicy.from_settings(settings)
    if redis is not None:
        link = link or RedisLink("learner", **metrics.redis.link_callbacks())
        task_stream = tasks_stream(redis, keys, link=link)
        if tasks and dispatcher is None:
            # the tasks the rollout workers dead-letter: replaced, recorded, never dealt out again
            dead = DeadTasks(dead_tasks_path(settings.log_dir, settings.redis.run), task_stream.burials(),
                             task_stream)
            dispatcher = Dispatcher(task_stream, tasks, settings.dispatcher, on_publish=metrics.tasks.inc,
                                    staleness=staleness, vocab_size=training.vocab_size(), record=record,
                                    dead=dead, on_replace=metrics.tasks_replaced.labels("dead_lettered").inc)
        if source is None:
            trajectories = trajectories_stream(redis, keys, link=link,
                                               visibility_timeout_ms=settings.visibility_timeout_ms,
                                               max_deliveries=settings.max_deliveries, fence=lease)
            source = StreamSource(settings, trajectories, task_stream, staleness, metrics,
                                  vocab_size=training.vocab_size(), dispatcher=dispatcher)
    if transport is None:
        transport = build_transport(settings.weights, publisher, redis if info.is_main else None, keys, link,
                                    lease)
    guard = (CollapseGuard(settings.guard, settings.checkpoint.dir, metrics.registry)
             if settings.guard.enabled else None)
    desync = DesyncPolicy.from_settings(settings.desync) if settings.desync.enabled else None
    learner = Learner(settings, training, checkpointer, publisher, transport, metrics, step_log, info=info,
                      source=source, redis=redis, link=link, archive=archive, lease=lease, dispatcher=dispatcher,
                      guard=guard, desync=desync, watchdog=watchdog, faults=faults)
    if watchdog is not None:  # a stall names what the loop was doing
        watchdog.describe = learner.doing
    return learner


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
                            step_log=StepLog(settings.log_dir / f"{settings.redis.run}.jsonl"),
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
        return await _run(settings, info, stop, max_steps, None, None, LearnerMetrics(),
                          watchdog=Watchdog("learner", settings.stall_timeout_s), faults=faults)
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
        return await tasks.run(_run(settings, info, stop, max_steps, redis, lease, metrics, link, watchdog, faults),
                               stop, grace_s=settings.stall_timeout_s)
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
               redis, lease: Lease | None, metrics: LearnerMetrics, link: RedisLink | None = None,
               watchdog: Watchdog | None = None, faults: Faults = NO_FAULTS) -> TrainState:
    """`run_learner` once the run's lease is held (rank 0: with its Redis link and progress watchdog) or on
    the other ranks (no Redis; each node's local rank 0 serves that node's `/healthz`)."""
    from searchr1.core.metrics import start_metrics_server
    from searchr1.core.servers import HttpServer
    from searchr1.learner.tools.data import load_tasks, oversample
    from searchr1.learner.tools.dispatch_log import DispatchLog, dispatch_log_path
    from searchr1.weightsync import weights_app

    specs: list[Question] = []
    if info.is_main and settings.dispatcher.enabled and settings.dispatcher.dataset:
        # the dataset before the model: a row the wire refuses stops the start (exit 2) in seconds
        specs = await asyncio.to_thread(
            lambda: oversample(load_tasks(settings.dispatcher.dataset), settings.dispatcher.source_repeats))
    training = await asyncio.to_thread(build_training, settings, info, metrics.stages)
    step_log = http = metrics_server = archive = dispatch_log = base_url = None
    if info.is_main:
        wandb_run = None
        if settings.wandb_project:
            import wandb  # optional

            wandb_run = wandb.init(project=settings.wandb_project, name=settings.redis.run,
                                   config=redact_config(settings.model_dump(mode="json")))
        step_log = StepLog(settings.log_dir / f"{settings.redis.run}.jsonl", wandb_run)
        if settings.weights.http:  # serves what the publisher writes under weights.dir
            served = WeightPublisher(settings.weights.dir, keep=settings.weights.keep)
            http = HttpServer(weights_app(served, token=settings.weights.token), settings.weights.host,
                              settings.weights.port)
            await http.start()
            base_url = f"http://{settings.weights.public_host or settings.weights.host}:{http.port}"
        if settings.archive.enabled:
            archive = await asyncio.to_thread(ArchiveWriter, settings.archive_dir, settings.archive.every_steps)
    if settings.metrics_port is not None and (info.is_main or os.environ.get("LOCAL_RANK") == "0"):
        metrics_server = start_metrics_server(metrics.registry, host=settings.metrics_host,
                                              port=settings.metrics_port, ready=lambda: link is None or link.up,
                                              live=None if watchdog is None else watchdog.alive,
                                              token=None if settings.metrics_open else settings.token)
    learner = None
    try:
        if specs:
            dispatch_log = DispatchLog(dispatch_log_path(settings.log_dir, settings.redis.run))
        learner = build_learner(settings, training, info=info, metrics=metrics, step_log=step_log, redis=redis,
                                lease=lease, link=link, base_url=base_url, archive=archive, tasks=specs,
                                record=dispatch_log.record if dispatch_log is not None else None,
                                watchdog=watchdog, faults=faults)
        await learner.start()
        return await learner.run(stop, max_steps=max_steps)
    finally:
        if dispatch_log is not None:
            dispatch_log.close()
        if learner is not None:
            learner.transport.close()
        if http is not None:
            await http.stop()
        if metrics_server is not None:
            metrics_server.close()
