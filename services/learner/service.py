"""The learner process: one loop that reads top to bottom as named stages

    read groups → filter (replays, temperature, staleness) → dead-letter → batch → advantages + train
    step → archive → checkpoint → ack → publish weights → grant tasks → log

plus the dispatcher task feeding the tasks stream and (optionally) the HTTP server for snapshots.
Which groups are too stale and how many tasks the dispatcher is granted is the `StalenessPolicy`'s
rule (`staleness.py`); the temperature check is `sampling.py`'s; DAPO's dynamic sampling reads through
`dynamic_reading.py`; figures are computed in `figures.py`.

Delivery guarantees: a trajectory-stream entry is acked only after the step that consumed it is
checkpointed, and the checkpoint records the consumed task ids; a learner killed before acking re-reads
its groups after restart (reclaimed once idle past the visibility timeout) and acks without retraining
those whose task ids the checkpoint already holds. Every trained group is in the trajectory archive
(`archive.py`), fsynced before its entries are acked. On start the learner resumes from the latest
checkpoint and (re)announces its current version (version 0 = the initial weights).

Redis away: every Redis call of rank 0 (reads, acks, the dispatcher's publishes, weight announcements)
goes through one `RedisLink` and waits for Redis to come back, so an ack waits behind its checkpoint
and nothing is acked that was not trained; once Redis is back the learner first re-reads the entries
still pending for it that it does not hold (a read whose reply the outage lost). `link.up` is the
readiness `/readyz` reports on the metrics port (a PING every second keeps it current).

Data parallel under torchrun: rank 0 alone talks to Redis and broadcasts each step's groups (msgpack,
never pickle; `distributed.py`) to the other ranks; every rank trains on its shard; checkpoints and
snapshots are gathered to rank 0, which writes them.

The event loop never blocks: training, collectives (the broadcast included), checkpoints, snapshot
writes and pruning, and the step-log write run in threads (`asyncio.to_thread`), one at a time and in the
same order on every rank, so the dispatcher task on rank 0's loop keeps feeding the tasks stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from searchr1.core.aio import stop_task
from searchr1.core.faults import fault_point
from searchr1.core.metrics import in_stage
from searchr1.core.redis_link import RedisLink
from searchr1.core.schemas import Task, TrajectoryGroup
from searchr1.core.streams import StreamKeys, TypedStream, tasks_stream, trajectories_stream
from searchr1.learner.archive import ArchiveWriter
from searchr1.learner.batch import Batch, build_batch
from searchr1.learner.checkpoint import Checkpointer, TrainState
from searchr1.learner.distributed import broadcast_groups, init_distributed
from searchr1.learner.dynamic_reading import sample_informative
from searchr1.learner.dynamic_sampling import mask_overlong
from searchr1.learner.figures import by_source, group_figures
from searchr1.learner.guard import CollapseGuard
from searchr1.learner.health import health_figures
from searchr1.learner.metrics import LearnerMetrics, StepLog
from searchr1.learner.model import DistInfo, export_weights
from searchr1.learner.publisher import WeightPublisher
from searchr1.learner.sampling import temperature_mismatch
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.staleness import Dropped, StalenessPolicy
from searchr1.learner.step_input import StepInput
from searchr1.learner.training import Training, build_training

__all__ = ["Learner", "StepInput", "Training", "build_training", "run_learner"]

log = logging.getLogger("searchr1.learner")


def _stages(learner: Learner):
    """The learner's stage clock (`metrics.STAGES`; each stage method below runs in its stage)."""
    return getattr(learner.metrics, "stages", None)


# ---------------------------------------------------------------------------- the loop


class Learner:
    """Runs the learner loop. Dependencies are passed in; `redis` may be None on ranks other than 0."""

    def __init__(
        self,
        settings: LearnerSettings,
        training: Training,
        checkpointer: Checkpointer,
        publisher: WeightPublisher,
        metrics: LearnerMetrics,
        step_log: StepLog | None,
        *,
        redis=None,
        info: DistInfo | None = None,
        archive: ArchiveWriter | None = None,
        link: RedisLink | None = None,
    ) -> None:
        self.s = settings
        self.training = training
        self.checkpointer = checkpointer
        self.publisher = publisher
        self.metrics = metrics
        self.step_log = step_log
        self.redis = redis
        self.info = info or DistInfo()
        self.archive = archive if self.info.is_main else None
        training.trainer.stage_clock = _stages(self)  # times the optimizer step within `train`
        self.stages: deque[str] = deque(maxlen=64)
        """The last stages run, in order (`archive`, `checkpoint`, `ack`, …): the loop's record of itself."""
        self.keys = StreamKeys(settings.redis.run)
        self.staleness = StalenessPolicy.from_settings(settings)
        self.state = TrainState()
        self.unacked: list[str] = []
        self.holding: set[str] = set()
        """Ids of the entries read and not yet acked or dead-lettered."""
        self.filter_figures: dict[str, float] = {}  # DAPO filters' counts, logged with the next step
        self.guard = CollapseGuard(settings.guard, self) if settings.guard.enabled else None
        self._dispatcher: Any = None  # set by `run` on rank 0
        self.trajectories: TypedStream[TrajectoryGroup] | None = None
        self.tasks: TypedStream[Task] | None = None
        self.link = link
        if redis is not None:
            if self.link is None:
                self.link = RedisLink("learner", **metrics.redis.link_callbacks())
            self.trajectories = trajectories_stream(redis, self.keys,
                                                    visibility_timeout_ms=settings.visibility_timeout_ms,
                                                    max_deliveries=settings.max_deliveries, link=self.link)
            self.tasks = tasks_stream(redis, self.keys, link=self.link)

    # ------------------------------------------------------------------ start-up

    async def start(self) -> TrainState:
        """Resume from the latest checkpoint and announce the current version."""
        restored = await asyncio.to_thread(self.checkpointer.load, self.training.components)
        if restored is not None:
            self.state = restored
            log.info("resumed from step %d (version %d)", restored.step, restored.version)
        if self.trajectories is not None:
            await self.trajectories.ensure_group()
            await self.tasks.ensure_group()
        await self.publish_weights()  # a collective under FSDP: every rank writes-or-not alike
        return self.state

    # ------------------------------------------------------------------ stages

    @in_stage("queue_wait", _stages)
    async def read_groups(self, stop: asyncio.Event, want: int | None = None) -> StepInput:
        """Stage 1: reclaim groups left unacked by a dead learner, then read new ones until a step's
        worth (`groups_per_step`, or `want`) is in hand or `stop` is set."""
        want = self.s.batch.groups_per_step if want is None else want
        got = StepInput()
        got.entries.extend(await self.trajectories.reclaim(self.s.consumer, count=want))
        while len(got.entries) < want and not stop.is_set():
            self.holding.update(e.id for e in got.entries)
            got.entries.extend(await self.trajectories.reread_own(self.s.consumer, self.holding,
                                                                  want - len(got.entries)))
            if len(got.entries) >= want:
                break
            got.entries.extend(await self.trajectories.read(
                self.s.consumer, count=want - len(got.entries), block_ms=self.s.read_block_ms))
            if len(got.entries) < want and await self.data_exhausted():
                break  # the last, partial step of the run
        self.holding.update(e.id for e in got.entries)
        return got

    async def data_exhausted(self) -> bool:
        """True when the dispatcher has published its last epoch and every task and group is consumed."""
        if self._dispatcher is None or not self._dispatcher.exhausted:
            return False
        return await self.tasks.in_flight() == 0 and await self.trajectories.lag() == 0

    def filter_groups(self, got: StepInput) -> StepInput:
        """Stage 2: set aside replays of task ids already trained on, groups sampled at another
        temperature than the learner's, and groups too stale under the staleness policy."""
        fresh = []
        seen = set(self.state.consumed)
        for e in got.entries:
            tid = e.value.task.task_id
            if tid in seen:
                got.replays.append(e)
            elif (reason := temperature_mismatch(e.value)) is not None:
                got.wrong_temperature.append(Dropped(e, reason))
            else:
                seen.add(tid)
                fresh.append(e)
        kept, got.stale = self.staleness.split(fresh, self.state.version, group=lambda e: e.value)
        got.groups = [e.value for e in kept]
        self.metrics.dropped.labels("replay").inc(len(got.replays))
        self.metrics.dropped.labels("stale").inc(len(got.stale))
        self.metrics.dropped.labels("temperature").inc(len(got.wrong_temperature))
        for d in got.stale:
            log.info("dropping group of task %s: %s", d.item.value.task.task_id, d.reason)
        # replace the tasks that will not be trained on; a replay's task was trained (and replaced) already:
        # granting for it too would put the dispatcher one task ahead for the rest of the run
        self.grant(got.untrained_tasks)
        return got

    async def set_aside(self, got: StepInput) -> StepInput:
        """Stages 2–3 for one read: filter, dead-letter, and queue the replays and stale groups for the
        next ack (replays were checkpointed already; stale ones are never trained on)."""
        got = self.filter_groups(got)
        await self.dead_letter(got)
        self.unacked.extend(e.id for e in got.replays)
        self.unacked.extend(d.item.id for d in got.stale)
        return got

    async def dead_letter(self, got: StepInput) -> None:
        """Stage 3: move the groups that can never be trained on to the dead stream, with the reason."""
        for d in got.wrong_temperature:
            log.warning("dead-lettering group of task %s: %s", d.item.value.task.task_id, d.reason)
            await self.trajectories.dead_letter(d.item.id, d.reason)
            self.holding.discard(d.item.id)

    def grant(self, consumed: int) -> None:
        """Let the dispatcher publish the tasks the staleness policy grants for `consumed` groups, stamped
        for the current version."""
        if self._dispatcher is not None:
            self._dispatcher.grant(self.staleness.grant(consumed), self.state.version)

    def make_batch(self, groups: list[TrajectoryGroup]) -> Batch:
        """Stage 4: pad the groups into a batch (the trainer computes the advantages)."""
        return build_batch(groups, pad_id=self.training.pad_id, max_seq_len=self.s.batch.max_seq_len)

    @in_stage("forward_backward", _stages)
    def train(self, batch: Batch) -> dict[str, float]:
        """Stage 5: advantages and one training step (every rank)."""
        return self.training.trainer.train_step(batch, self.state.version)

    @in_stage("archive", _stages)
    async def archive_step(self, groups: list[TrajectoryGroup], entry_ids: list[str]) -> None:
        """Stage 6: make the step's groups durable in the trajectory archive (rank 0), before any ack."""
        if self.archive is not None:
            await asyncio.to_thread(self.archive.append, self.state.step, groups, entry_ids)
        self.stages.append("archive")
        fault_point("learner.after_archive")  # test hook (core/faults.py): off unless its env var is set

    @in_stage("checkpoint", _stages)
    def checkpoint(self) -> None:
        """Stage 7: save a resumable checkpoint (collective)."""
        self.checkpointer.save(self.state, self.training.components)
        self.stages.append("checkpoint")
        fault_point("learner.after_checkpoint")  # test hook (core/faults.py): off unless its env var is set

    async def ack(self) -> None:
        """Stage 8: ack every group whose step is checkpointed (and archived)."""
        if self.unacked and self.trajectories is not None:
            await self.trajectories.ack(*self.unacked)
        self.holding.difference_update(self.unacked)
        self.unacked.clear()
        self.stages.append("ack")

    @in_stage("weight_publish", _stages)
    async def publish_weights(self, force_write: bool = True) -> None:
        """Stage 9: snapshot (collective gather), announce and prune."""
        if force_write:
            model, state = await asyncio.to_thread(export_weights, self.training.trainer.policy, self.info)
            if self.info.is_main:
                await asyncio.to_thread(self.publisher.write, self.state.version, model, state)
        if self.info.is_main and self.redis is not None:
            wv = await self.publisher.announce(self.redis, self.keys, self.state.version, link=self.link)
            self.metrics.version.set(wv.version)

    # ------------------------------------------------------------------ loop

    async def step_once(self, stop: asyncio.Event) -> bool:
        """One step on rank 0 (or single process). Returns False when stopped before training."""
        got = await self.read_groups(stop)
        if stop.is_set() and len(got.entries) < self.s.batch.groups_per_step:
            return False  # no partial step on shutdown: the unacked groups are re-read after a restart
        got = await self.set_aside(got)
        want = self.s.batch.groups_per_step
        # groups set aside leave the step short: read their replacements, or the step trains short and the
        # tasks of the groups it did not wait for are sampled a version early and dropped as stale
        while got.groups and len(got.groups) < want and not stop.is_set() and not await self.data_exhausted():
            got.merge(await self.set_aside(await self.read_groups(stop, want - len(got.groups))))
        if stop.is_set() and len(got.groups) < want:
            return False  # no partial step on shutdown: the unacked groups are re-read after a restart
        if self.s.algorithm.dynamic_sampling:
            got = await sample_informative(self, got, stop)
            if got is None:
                return False
        if not got.groups:
            await self.ack()
            return not stop.is_set()
        await asyncio.to_thread(broadcast_groups, got.groups, self.info)
        await self._train_and_commit(got.groups, got.group_entry_ids())
        return True

    async def _train_and_commit(self, groups: list[TrajectoryGroup], entry_ids: list[str]) -> None:
        """Stages 4 to 10 for one step's groups; `entry_ids` holds each group's stream entry (empty on ranks
        other than 0, and when replaying an archive)."""
        t0 = time.perf_counter()
        if self.s.algorithm.overlong_filter:
            groups, masked = mask_overlong(groups)
            self.filter_figures["overlong_masked"] = float(masked)
        batch = self.make_batch(groups)
        figures = await asyncio.to_thread(self.train, batch)
        self.stages.append("train")
        figures.update(self.filter_figures)
        self.filter_figures = {}
        step_seconds = time.perf_counter() - t0
        figures.update(group_figures(groups, self.state.version))
        figures.update(await asyncio.to_thread(health_figures, groups, figures))
        figures["by_source"] = by_source(groups)  # type: ignore[assignment]  # JSONL only
        figures.update(step_seconds=step_seconds, tokens=float(batch.num_tokens),
                       loss_tokens=float(batch.num_loss_tokens),
                       tokens_per_second=batch.num_tokens / max(step_seconds, 1e-9))
        self.state.step += 1
        self.state.version += 1
        self.state.consumed.update(g.task.task_id for g in groups)
        await self.archive_step(groups, entry_ids or [""] * len(groups))
        self.unacked.extend(e for e in entry_ids if e)
        if self.state.step % self.s.checkpoint.every == 0:
            if self._dispatcher is not None:  # read on the loop thread, where the dispatcher runs
                self.state.dispatcher = self._dispatcher.position()
            await asyncio.to_thread(self.checkpoint)
            await self.ack()
        await self.publish_weights()
        self.grant(len(groups))  # the next tasks are sampled with the weights just announced
        if self.info.is_main:
            self.metrics.groups.inc(len(groups))
            self.metrics.trajectories.inc(figures["trajectories"])
            self.metrics.tokens.inc(batch.num_tokens)
            self.metrics.observe_step(figures)
            if self.step_log is not None:
                await asyncio.to_thread(self.step_log.write, self.state.step,
                                        {"version": self.state.version, **figures,
                                         "stage_seconds": self.metrics.stage_seconds()})
            log.info("step %d: loss %.4f reward %.3f %.0f tok/s", self.state.step, figures.get("loss", 0.0),
                     figures["reward_mean"], figures["tokens_per_second"])
            if self.guard is not None:
                await self.guard.after_step(self, figures)

    async def run(self, stop: asyncio.Event, max_steps: int | None = None, dispatcher=None) -> TrainState:
        """Train until `stop`, `max_steps` (default `optim.total_steps`) or the dispatcher runs dry.
        Ranks other than 0 follow rank 0's broadcasts."""
        limit = max_steps if max_steps is not None else self.s.optim.total_steps
        if not self.info.is_main:
            while True:  # rank 0 always ends with a stop broadcast
                groups = await asyncio.to_thread(broadcast_groups, None, self.info)
                if groups is None:
                    break
                await self._train_and_commit(groups, [])
            return self.state
        disp_task = None
        self._dispatcher = dispatcher
        halt = asyncio.Event()  # ends the dispatcher when this loop ends (a cancel alone can be lost: core.aio)
        if dispatcher is not None:
            disp_task = asyncio.create_task(dispatcher.run(halt))
        watch_task = None
        if self.link is not None and self.redis is not None:
            watch_task = asyncio.create_task(self.link.watch(self.redis, halt))
        try:
            while self.state.step < limit and not stop.is_set() and not (self.guard and self.guard.stopped):
                await self.step_once(stop)
                if await self.data_exhausted() and await self.trajectories.pending() == 0:
                    log.info("dataset exhausted after %d epochs: stopping", self.s.dispatcher.epochs)
                    break
        finally:
            if self.info.enabled:
                await asyncio.to_thread(broadcast_groups, None, self.info)
            halt.set()
            if disp_task is not None:
                await stop_task(disp_task, timeout=10.0)
            if watch_task is not None:
                await stop_task(watch_task, timeout=5.0)
        return self.state


# ---------------------------------------------------------------------------- process entry point


async def run_learner(settings: LearnerSettings, stop: asyncio.Event | None = None,
                      max_steps: int | None = None) -> TrainState:
    """Everything `searchr1 train` does: models, Redis, dispatcher, weight server, metrics, loop."""
    from searchr1.core.metrics import start_metrics_server
    from searchr1.core.redis_link import RedisLink
    from searchr1.core.servers import HttpServer, install_shutdown_signals
    from searchr1.core.streams import connect
    from searchr1.learner.data import load_tasks, oversample
    from searchr1.learner.dispatcher import Dispatcher
    from searchr1.learner.publisher import weights_app

    if settings.archive.replay_from is not None:
        from searchr1.learner.replay import run_replay

        return await run_replay(settings, stop, max_steps)
    info = init_distributed()
    stop = stop or asyncio.Event()
    install_shutdown_signals(stop)
    training = await asyncio.to_thread(build_training, settings, info)
    publisher = WeightPublisher(settings.weights.dir, keep=settings.weights.keep)
    metrics = LearnerMetrics()
    step_log = None
    http = metrics_server = redis = link = None
    if info.is_main:
        wandb_run = None
        if settings.wandb_project:
            import wandb  # optional

            wandb_run = wandb.init(project=settings.wandb_project, name=settings.redis.run,
                                   config=settings.model_dump(mode="json"))
        step_log = StepLog(settings.log_dir / f"{settings.redis.run}.jsonl", wandb_run)
        redis = connect(settings.redis.url)
        link = RedisLink("learner", **metrics.redis.link_callbacks())
        if settings.weights.http:
            http = HttpServer(weights_app(publisher, token=settings.weights.token), settings.weights.host,
                              settings.weights.port)
            await http.start()
            publisher.base_url = f"http://{settings.weights.public_host or settings.weights.host}:{http.port}"
        if settings.metrics_port is not None:
            metrics_server = start_metrics_server(metrics.registry, host=settings.metrics_host,
                                                  port=settings.metrics_port, ready=lambda: link.up,
                                                  token=None if settings.metrics_open else settings.token)
    archive = None
    if info.is_main and settings.archive.enabled:
        archive = await asyncio.to_thread(ArchiveWriter, settings.archive_dir, settings.archive.every_steps)
    learner = Learner(settings, training, Checkpointer(settings.checkpoint.dir, settings.checkpoint.keep, info),
                      publisher, metrics, step_log, redis=redis, info=info, archive=archive, link=link)
    try:
        state = await learner.start()
        dispatcher = None
        if info.is_main and settings.dispatcher.enabled and settings.dispatcher.dataset:
            pos = state.dispatcher or {}
            specs = oversample(load_tasks(settings.dispatcher.dataset), settings.dispatcher.source_repeats)
            dispatcher = Dispatcher(learner.tasks, specs, settings.dispatcher,
                                    epoch=pos.get("epoch", 0), cursor=pos.get("cursor", 0),
                                    on_publish=metrics.tasks.inc, staleness=learner.staleness,
                                    version=state.version, downstream=learner.trajectories)
        return await learner.run(stop, max_steps=max_steps, dispatcher=dispatcher)
    finally:
        if http is not None:
            await http.stop()
        if metrics_server is not None:
            metrics_server.close()
        if redis is not None:
            await redis.aclose()
