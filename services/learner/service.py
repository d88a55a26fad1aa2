"""The learner process: one loop that reads top to bottom as named stages

    next step's groups (the group source) → batch → advantages + train step → archive → checkpoint →
    ack → publish weights → grant tasks → log

plus the dispatcher task feeding the tasks stream. Its collaborators are wired by `compose.build_learner`
(grouped as `parts.py` names them; a missing one is a null object there, so no stage asks whether it is
present); the process around it — lease, models, Redis, metrics server — is `process.py`'s.
Where each step's groups come from, and how they are read, filtered, set aside and acked, is the group
source's (`sources/`: the trajectories stream, or an archive for `train --replay`); the training step is
`train/`'s; the math is `algo/`'s; figures are computed in `algo/figures.py`; the desync screen that
sets a worker's groups aside before they train is `desync_screen.py`'s.

Delivery guarantees: a trajectory-stream entry is acked only after the step that consumed it is
checkpointed, and the checkpoint records the consumed task ids; a learner killed before acking re-reads
its groups at once after restart (the entries pending for its consumer) and acks without retraining
those whose task ids the checkpoint already holds. Every trained group is in the trajectory archive
(`tools/archive.py`), fsynced before its entries are acked. On start the learner resumes from the latest
checkpoint and (re)announces its current version (version 0 = the initial weights).

One learner per run: rank 0 holds the run's lease (`searchr1.streams.Lease`) from before the models load
until it exits, and makes sure it is still its own before every checkpoint, snapshot, announcement and ack
(`hold_lease`); its fencing token goes into each of them. The writes Redis holds are fenced inside Redis
by one script each (acks and dead letters: `searchr1.streams`; announcements and the recovery-snapshot
record: `searchr1.weightsync`); before a checkpoint the token is checked against Redis (`Lease.verify`), and the
checkpoint itself is fenced on disk (`train/fences.py`). A second learner refuses to start. A loop that makes
no progress for `stall_timeout_s` stops renewing the lease and fails `/healthz` (the progress watchdog).

Redis away: every Redis call of rank 0 (reads, acks, the dispatcher's publishes, weight announcements)
goes through one `RedisLink` and waits for Redis to come back, so an ack waits behind its checkpoint
and nothing is acked that was not trained; once Redis is back the learner first re-reads the entries
still pending for it that it does not hold (a read whose reply the outage lost). `link.up` is the
readiness `/readyz` reports on the metrics port (a PING every second keeps it current).

Data parallel under torchrun: rank 0 alone talks to Redis and broadcasts each step's groups (msgpack,
never pickle; `train/distributed.py`) to the other ranks; every rank trains on its shard; checkpoints and
snapshots are gathered to rank 0, which writes them.

The event loop never blocks: training, collectives (the broadcast included), checkpoints, snapshot
writes and pruning, and the step-log write run in threads (`asyncio.to_thread`), one at a time and in the
same order on every rank, so the dispatcher task on rank 0's loop keeps feeding the tasks stream.

Liveness (docs/reliability.md, "Liveness"): the dispatcher and the Redis watch run supervised
(`searchr1.core.supervise`): either dying stops the loop at its next check and the process with the cause.
The watchdog counts progress — a step trained, a checkpoint's bytes written — never waiting: a step that
cannot fill is answered by replacements (the source's, the dispatcher's for dead-lettered tasks) or, past
`stall_timeout_s`, by a stop naming what the loop waited for (`doing`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from contextlib import AbstractContextManager
from typing import Any

from searchr1.core.faults import NO_FAULTS, Faults
from searchr1.core.metrics import in_stage
from searchr1.core.schemas import TrajectoryGroup
from searchr1.core.supervise import Supervisor
from searchr1.learner.algo.batch import Batch, build_batch
from searchr1.learner.algo.figures import by_source, group_figures
from searchr1.learner.algo.group_filters import mask_overlong
from searchr1.learner.algo.health import health_figures
from searchr1.learner.guard import Decision
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.parts import Checks, Feed, Outputs, RedisSide, Weights
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.base import StepGroups
from searchr1.learner.train.build import Training
from searchr1.learner.train.checkpoint import Checkpointer, TrainState
from searchr1.learner.train.distributed import broadcast_groups
from searchr1.learner.train.model import DistInfo, export_weights
from searchr1.learner.train.rollback import roll_back

__all__ = ["Learner"]

log = logging.getLogger("searchr1.learner")


def _stages(learner: Learner):
    """The learner's stage clock (`metrics.STAGES`; each stage method below runs in its stage)."""
    return getattr(learner.metrics, "stages", None)


# ---------------------------------------------------------------------------- the loop


class Learner:
    """Runs the learner loop over collaborators wired whole by `compose.build_learner`, in the groups
    `parts.py` defines: the run's Redis side (client, link, lease), its weights (publisher, transport,
    server), its feed (group source, dispatcher), its outputs (step log, archive) and its checks (collapse
    guard, desync screen, watchdog). Each stage uses its collaborators without asking whether they are
    there: a missing one is a null object."""

    def __init__(self, settings: LearnerSettings, training: Training, *, info: DistInfo,
                 metrics: LearnerMetrics, checkpointer: Checkpointer, weights: Weights, feed: Feed,
                 redis: RedisSide, outputs: Outputs, checks: Checks, faults: Faults = NO_FAULTS) -> None:
        self.s = settings
        self.training = training
        self.info = info
        self.metrics = metrics
        self.checkpointer = checkpointer
        self.faults = faults
        """The fault suite's hook (`learner.after_archive`, `learner.after_checkpoint`); never fires outside
        it."""
        self.weights = weights
        self.publisher = weights.publisher
        """The snapshot store (what the weight server serves, and the rollback's published weights)."""
        self.transport = weights.transport
        """Delivers and announces each version (rank 0)."""
        self.source = feed.source
        """Where each step's groups come from (`NoSource` on ranks other than 0: they follow rank 0's
        broadcasts)."""
        self.dispatcher = feed.dispatcher
        """Feeds the tasks stream on rank 0 (run as a task beside the loop); its position is checkpointed."""
        self.redis = redis.client
        """Rank 0's Redis (watched through `link` while the loop runs); None without one."""
        self.link = redis.link
        self.lease = redis.lease
        """The run's lease (rank 0 of a learner on Redis): checked before every checkpoint, snapshot,
        announcement and ack; its fencing token goes into each of them."""
        self.step_log = outputs.step_log
        self.archive = outputs.archive
        self.guard = checks.guard
        self.desync = checks.screen
        """The desync screen (`desync_screen.py`, the rule `algo/desync.py`), run on every step's groups
        before they train."""
        self.watchdog = checks.watchdog
        """Beaten by progress only — the start done, a step trained, a checkpoint's bytes written — never by
        waiting: on rank 0 a loop that stops making progress stops renewing the lease, fails `/healthz` and
        stops the process naming what it waited for (`process.py`); on another node it fails that node's
        `/healthz`."""
        self.halted: str | None = None
        """Why a policy stopped the run (the collapse guard's message), once one has."""
        self.last_step: int | None = None
        """The step `run` ends at (`max_steps` or `optim.total_steps`): checkpointed whatever the cadence."""
        self.stages: deque[str] = deque(maxlen=64)
        """The last stages run, in order (`archive`, `checkpoint`, `ack`, …): the loop's record of itself."""
        self.state = TrainState()

    def beat(self) -> None:
        """The loop made progress (the watchdog's beat)."""
        self.watchdog.beat()

    def waiting_for_rank0(self) -> AbstractContextManager[None]:
        """Ranks other than 0 waiting for rank 0's next step: no stall of theirs (rank 0's watchdog bounds
        it), so their watchdog excuses it."""
        return self.watchdog.waiting()

    # ------------------------------------------------------------------ start-up

    async def start(self) -> TrainState:
        """Resume from the latest checkpoint (the dispatcher from its saved position), prepare the group
        source and announce the current version."""
        restored = await asyncio.to_thread(self.checkpointer.load, self.training.components)
        if restored is not None:
            self.state = restored
            log.info("resumed from step %d (version %d)", restored.step, restored.version)
        self.dispatcher.restore(self.state.dispatcher or {}, self.state.version)
        await self.source.start()
        await self.publish_weights()  # a collective under FSDP: every rank writes-or-not alike
        self.beat()  # resumed and announced: the start is done
        return self.state

    def doing(self) -> str:
        """What the loop is doing, in a line (the watchdog's stall message): what the source's read waits
        for, else the last stage run."""
        waiting = getattr(self.source, "waiting_for", "")
        last = self.stages[-1] if self.stages else "start-up"
        return waiting or f"after stage {last!r} of step {self.state.step}"

    # ------------------------------------------------------------------ stages

    def make_batch(self, groups: list[TrajectoryGroup]) -> Batch:
        """Pad the groups into a batch (the trainer computes the advantages)."""
        return build_batch(groups, pad_id=self.training.pad_id, max_seq_len=self.s.batch.max_seq_len)

    @in_stage("forward_backward", _stages)
    def train(self, batch: Batch) -> dict[str, float]:
        """Advantages and one training step (every rank); `nonfinite_grad_skips` counts the optimizer
        updates skipped for a NaN/inf gradient norm."""
        trainer = self.training.trainer
        before = trainer.nonfinite_skips
        figures = trainer.train_step(batch, self.state.version)
        figures["nonfinite_grad_skips"] = float(trainer.nonfinite_skips - before)
        return figures

    @in_stage("archive", _stages)
    async def archive_step(self, groups: list[TrajectoryGroup], entry_ids: list[str]) -> None:
        """Make the step's groups durable in the trajectory archive (rank 0), before any ack."""
        await asyncio.to_thread(self.archive.append, self.state.step, groups, entry_ids)
        self.stages.append("archive")
        self.faults.kill_at("learner.after_archive")  # the fault suite's hook: never fires outside it

    async def hold_lease(self, in_redis: bool = False) -> None:
        """Before a write: make sure the run's lease is still this learner's. Renewed through the Redis
        link when its last renewal is too old (waiting for Redis through an outage); raises `LeaseLost`
        when another learner took it or it expired meanwhile (the process stops; a restart resumes from
        the checkpoint). `in_redis`: also check the token against the lease in Redis (`Lease.verify`),
        for a write Redis does not fence itself (a checkpoint)."""
        if not self.lease.valid():
            await self.link.call(self.lease.renew, "renew lease")
            self.lease.check()
        if in_redis:
            await self.link.call(self.lease.verify, "verify lease")

    @in_stage("checkpoint", _stages)
    def checkpoint(self) -> None:
        """Save a resumable checkpoint (collective)."""
        self.checkpointer.save(self.state, self.training.components)
        self.stages.append("checkpoint")
        self.faults.kill_at("learner.after_checkpoint")  # the fault suite's hook: never fires outside it

    async def ack(self, checkpointed: bool = True) -> None:
        """Ack the groups set aside and, when `checkpointed`, every group whose step is checkpointed (and
        archived)."""
        await self.hold_lease()
        await self.source.ack(checkpointed)
        self.stages.append("ack")

    @in_stage("weight_publish", _stages)
    async def publish_weights(self) -> dict[str, float]:
        """Gather the weights (a collective), cast to the published dtype, and hand them to the transport
        (rank 0), which delivers and announces them — in full or as a delta against the previous version
        (`searchr1.weightsync`). Returns the publication's figures: the share of published values whose
        bits changed since the previous version (the delta's density), the bytes written ({} on other ranks;
        no share at the first version)."""
        await self.hold_lease()
        model, state = await asyncio.to_thread(
            export_weights, self.training.trainer.policy, self.info, self.training.publish_dtype)
        if not self.info.is_main:
            return {}
        wv = await self.transport.publish(self.state.version, model, state)
        if wv is not None:
            self.metrics.version.set(wv.version)
        return dict(self.transport.figures)

    # ------------------------------------------------------------------ loop

    async def step_once(self, stop: asyncio.Event) -> bool:
        """One step on rank 0 (or single process). Returns False when stopped before training."""
        step = await self.source.next_step(stop, self.state)
        if step is None:
            return False
        if not step.groups:  # every group read was set aside: ack those, not the uncheckpointed steps' groups
            await self.ack(checkpointed=False)
            return not stop.is_set()
        await asyncio.to_thread(broadcast_groups, step.groups, self.info)
        await self.train_and_commit(step)
        return True

    async def train_and_commit(self, step: StepGroups) -> None:
        """Batch, train, archive, checkpoint, ack, publish, grant and log one step's groups (every rank;
        `step.entry_ids` is empty on ranks other than 0)."""
        t0 = time.perf_counter()
        step = await self.desync.screen(step)
        if not step.groups:  # every group came from a flagged worker: nothing to train this time
            return
        groups = step.groups
        filter_figures = dict(step.figures)
        if self.s.algorithm.overlong_filter:
            groups, masked = mask_overlong(groups)
            filter_figures["overlong_masked"] = float(masked)
        batch = self.make_batch(groups)
        figures = await asyncio.to_thread(self.train, batch)
        self.stages.append("train")
        self.beat()
        figures.update(filter_figures)
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
        await self.archive_step(groups, step.entry_ids or [""] * len(groups))
        self.source.commit(step.entry_ids)
        if self.state.step % self.s.checkpoint.every == 0 or self.state.step == self.last_step:
            self.state.dispatcher = self.dispatcher.position()  # on the loop thread, where it runs
            await self.hold_lease(in_redis=True)
            # a save that keeps writing is progress, however slow (the watchdog counts its bytes)
            with self.watchdog.progressing(self.checkpointer.bytes_written):
                await asyncio.to_thread(self.checkpoint)
            self.beat()
            await self.ack()
        figures.update(await self.publish_weights())
        self.source.grant(len(groups), self.state.version)  # the next tasks: sampled with these weights
        if self.info.is_main:
            await self.log_step(figures, batch, len(groups))

    async def log_step(self, figures: dict[str, Any], batch: Batch, groups: int) -> None:
        """Count the step in the metrics, write the step log and the log line (rank 0)."""
        self.metrics.groups.inc(groups)
        if figures.get("nonfinite_grad_skips"):
            self.metrics.nonfinite_grad.inc(figures["nonfinite_grad_skips"])
            log.error("step %d: %d optimizer update(s) skipped: NaN/inf gradient norm",
                      self.state.step, int(figures["nonfinite_grad_skips"]))
        self.metrics.trajectories.inc(figures["trajectories"])
        self.metrics.tokens.inc(batch.num_tokens)
        self.metrics.observe_step(figures)
        await asyncio.to_thread(self.step_log.write, self.state.step,
                                {"version": self.state.version, **figures,
                                 "stage_seconds": self.metrics.stage_seconds()})
        log.info("step %d: loss %.4f reward %.3f %.0f tok/s", self.state.step, figures.get("loss", 0.0),
                 figures["reward_mean"], figures["tokens_per_second"])
        await self.apply_guard(self.guard.judge(self.state.step, figures))

    async def apply_guard(self, d: Decision) -> None:
        """Carry out the collapse guard's decision: roll the policy back to its checkpoint (with a cut
        learning rate) and announce the rolled-back weights as a new version, or stop the run."""
        if d.action == "continue":
            return
        if d.action == "stop":
            self.halted = d.message
            event = self.guard.stop_event(d)
        else:
            assert d.checkpoint is not None
            lr = await asyncio.to_thread(roll_back, self.training.components, self.checkpointer, d.checkpoint,
                                         self.guard.s.lr_factor)
            self.state.version += 1  # the rolled-back weights, announced as a new version
            await self.publish_weights()
            event = self.guard.rolled_back(d, lr, self.state.version)
        await asyncio.to_thread(self.guard.record, self.state.step, event)
        await asyncio.to_thread(self.step_log.write, self.state.step, event)

    async def run(self, stop: asyncio.Event, max_steps: int | None = None) -> TrainState:
        """Train until `stop`, `max_steps` (default `optim.total_steps`) or the dispatcher runs dry.
        Ranks other than 0 follow rank 0's broadcasts."""
        limit = max_steps if max_steps is not None else self.s.optim.total_steps
        self.last_step = limit  # every rank: the last step's checkpoint is a collective under FSDP
        if not self.info.is_main:
            while True:  # rank 0 always ends with a stop broadcast
                with self.waiting_for_rank0():
                    groups = await asyncio.to_thread(broadcast_groups, None, self.info)
                if groups is None:
                    break
                await self.train_and_commit(StepGroups(groups))
            return self.state
        # the dispatcher and the Redis watch are supervised: a death stops the loop (at its next check) and
        # the process, with the cause (TaskDied), instead of a loop waiting on tasks nobody publishes
        tasks = Supervisor("learner")
        halt = asyncio.Event()  # ends them when this loop ends (a cancel alone can be lost: core.aio)
        # the dispatcher's backpressure: the groups published and not yet read (the null ones end at once)
        tasks.spawn("dispatcher", self.dispatcher.run(halt, downstream=self.source), may_finish=True)
        tasks.spawn("redis watch", self.link.watch(self.redis, halt), may_finish=True)
        try:
            await tasks.run(self._steps(stop, limit), stop, grace_s=self.s.stall_timeout_s)
        finally:
            if self.info.enabled:
                await asyncio.to_thread(broadcast_groups, None, self.info)
            halt.set()
            await tasks.close(timeout=10.0)
        return self.state

    async def _steps(self, stop: asyncio.Event, limit: int) -> None:
        """Rank 0's steps until `stop`, `limit`, a halt or the end of the data."""
        while self.state.step < limit and not stop.is_set() and self.halted is None:
            await self.step_once(stop)
            if await self.source.finished():
                log.info("no groups left to train on (dataset or archive exhausted): stopping")
                break
