"""`build_learner`: the one place a learner is wired, from its settings and the collaborators the process
owns (the trained models, rank 0's Redis side, the outputs, the watchdog, the fault hook).

It builds every other collaborator of the loop in dependency order — the checkpointer and the run's one
weight publisher (both fenced by the lease), the snapshots' HTTP server over that publisher, the streams
(the trajectories stream's acks fenced by the lease inside Redis), the staleness policy, the dispatcher,
the group source, the weight transport (its recovery-snapshot record fenced the same way), the collapse
guard and the desync screen — each with what it needs, puts a null object where one is not wanted
(`parts.py`), and hands them to `service.Learner` in their groups. Nothing is assigned on a built object
afterwards. What stays the process's (`process.py`): the lease, Redis, the models, the step log and
archive files, the metrics server, the dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchr1.core.datasets import Question
from searchr1.core.faults import NO_FAULTS, Faults
from searchr1.learner.algo.desync import DesyncPolicy
from searchr1.learner.algo.staleness import StalenessPolicy
from searchr1.learner.desync_screen import DesyncScreen
from searchr1.learner.dispatcher import Dispatcher
from searchr1.learner.guard import CollapseGuard
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.parts import (
    NO_GUARD,
    NO_LEASE,
    NO_REDIS,
    NO_SCREEN,
    NO_SERVER,
    NO_WATCHDOG,
    Checks,
    DispatcherLike,
    Feed,
    NoDispatcher,
    NoSource,
    Outputs,
    RedisSide,
    WatchdogLike,
    Weights,
)
from searchr1.learner.service import Learner
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.base import GroupSource
from searchr1.learner.sources.stream import StreamSource
from searchr1.learner.tools.dead_tasks import DeadTasks, dead_tasks_path
from searchr1.learner.train.build import Training
from searchr1.learner.train.checkpoint import Checkpointer
from searchr1.learner.train.model import DistInfo
from searchr1.streams import Lease, RedisLink, StreamKeys, tasks_stream, trajectories_stream
from searchr1.weightsync import WeightPublisher, build_transport

__all__ = ["build_learner"]


def build_learner(
    settings: LearnerSettings,
    training: Training,
    *,
    info: DistInfo | None = None,
    metrics: LearnerMetrics | None = None,
    redis: RedisSide | None = None,
    outputs: Outputs | None = None,
    watchdog: WatchdogLike = NO_WATCHDOG,
    tasks: Sequence[Question] = (),
    faults: Faults = NO_FAULTS,
    source: GroupSource | None = None,
    dispatcher: DispatcherLike | None = None,
    publisher: WeightPublisher | None = None,
) -> Learner:
    """The learner loop and every collaborator it needs. `training` is `build_training`'s (its trainer
    timed on `metrics.stages`). With `redis` (rank 0 of a live run) the group source is the trajectories
    stream and, given `tasks`, a dispatcher feeds the tasks stream (`outputs.record`: its durable dispatch
    record); without, the snapshots are written and not announced. The lease (`redis.lease`) fences the
    checkpointer, the publisher and every write (acks and the recovery-snapshot record inside Redis);
    `watchdog` is beaten by the loop's progress (never its reads) and names what the loop waits for when it
    stalls; `faults` is the fault suite's hook (the loop's
    and the checkpointer's points). `source`, `dispatcher` and `publisher` replace the ones built here (an
    archive for `train --replay`; tests)."""
    info = info or DistInfo()
    metrics = metrics or LearnerMetrics()
    outputs = outputs or Outputs()
    if settings.guard.enabled and info.enabled:
        raise ValueError("learner.guard needs a single-process learner (it is off for torchrun runs)")
    keys = StreamKeys(settings.redis.run)
    side = _redis_side(redis, metrics) if redis is not None and info.is_main else NO_REDIS
    lease = redis.lease if redis is not None else None  # the writers below take the lease itself, or None
    link = side.link if side.client is not None else None
    checkpointer = Checkpointer(settings.checkpoint.dir, settings.checkpoint.keep, info, lease=lease,
                                faults=faults)
    weights = _weights(settings, info, side.client, keys, link, lease, publisher)
    staleness = StalenessPolicy.from_settings(settings)
    if side.client is not None:
        task_stream = tasks_stream(side.client, keys, link=link)  # it only publishes: no re-delivery knobs
        if tasks and dispatcher is None:
            # the tasks the rollout workers dead-letter: replaced, recorded, never dealt out again
            dead = DeadTasks(dead_tasks_path(settings.log_dir, settings.redis.run), task_stream.burials(),
                             task_stream)
            dispatcher = Dispatcher(task_stream, tasks, settings.dispatcher, on_publish=metrics.tasks.inc,
                                    staleness=staleness, vocab_size=training.vocab_size(),
                                    record=outputs.record, dead=dead,
                                    on_replace=metrics.tasks_replaced.labels("dead_lettered").inc)
        if source is None:
            trajectories = trajectories_stream(side.client, keys, link=link,
                                               visibility_timeout_ms=settings.visibility_timeout_ms,
                                               max_deliveries=settings.max_deliveries, fence=lease)
            source = StreamSource(settings, trajectories, task_stream, staleness, metrics,
                                  vocab_size=training.vocab_size(), dispatcher=dispatcher)
    screen = (DesyncScreen(DesyncPolicy.from_settings(settings.desync), training, settings.batch, metrics,
                           info=info, run=settings.redis.run, source=source, redis=side.client, link=link)
              if settings.desync.enabled else NO_SCREEN)
    guard = (CollapseGuard(settings.guard, settings.checkpoint.dir, metrics.registry)
             if settings.guard.enabled else NO_GUARD)
    if not info.is_main:  # rank 0 alone writes the step log and the archive
        outputs = Outputs()
    return Learner(settings, training, info=info, metrics=metrics, checkpointer=checkpointer, weights=weights,
                   feed=Feed(source or NoSource(), dispatcher or NoDispatcher()), redis=side, outputs=outputs,
                   checks=Checks(guard, screen, watchdog), faults=faults)


def _redis_side(given: RedisSide, metrics: LearnerMetrics) -> RedisSide:
    """`given` with its lease and link filled in: `NO_LEASE` when none is held, a link counted on the
    learner's metrics when none was made."""
    link = given.link or RedisLink("learner", **metrics.redis.link_callbacks())
    return RedisSide(given.client, given.lease or NO_LEASE, link)


def _weights(settings: LearnerSettings, info: DistInfo, client: Any, keys: StreamKeys, link: RedisLink | None,
             lease: Lease | None, publisher: WeightPublisher | None) -> Weights:
    """The run's one weight publisher (fenced by `lease`; its URIs on the weight server when rank 0 serves
    the snapshots over HTTP: `weights.http`), that server over it, and the transport `weights.transport`
    names (announcing on `client`; without, snapshots written only)."""
    from searchr1.core.servers import HttpServer, bind_socket
    from searchr1.weightsync import weights_app

    w = settings.weights
    sock = bind_socket(w.host, w.port) if w.http and info.is_main and publisher is None else None
    if publisher is None:
        base_url = f"http://{w.public_host or w.host}:{sock.getsockname()[1]}" if sock is not None else None
        publisher = WeightPublisher(w.dir, w.keep, base_url, fence=lease.token if lease is not None else 0,
                                    guard=lease.check if lease is not None else None)
    server = (HttpServer(weights_app(publisher, token=w.token), w.host, w.port, sock=sock)
              if sock is not None else NO_SERVER)
    return Weights(publisher, build_transport(w, publisher, client, keys, link, lease), server)
