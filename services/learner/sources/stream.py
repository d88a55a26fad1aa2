"""The trajectories stream as a `GroupSource`: `StreamSource` reads, filters, sets aside and dead-letters
one step's groups, and acks them once the loop has checkpointed them.

Stages of `next_step`:

1. **read** (`read_groups`) — reclaim groups another (dead) learner left unacked past the visibility
   timeout, re-read entries still pending for this consumer that it does not hold (a read whose reply a
   Redis outage lost), then read new ones until a step's worth is in hand or the data is exhausted. While
   it waits it says what for (`waiting_for`: groups read, tasks in flight, groups unread, the dispatcher's
   budget; the learner's watchdog names it if the wait outlasts its bound: waiting is not progress), and a
   step that cannot fill — a paced dispatcher with no budget left, nothing in flight, nothing unread, for
   `UNFILLABLE_AFTER_S` — gets replacements for what it lacks (the tasks were lost: Redis lost data).
2. **filter** (`filter_groups`) — set aside replays (task ids the checkpoint already holds: acked, not
   trained), groups sampled at another temperature (`algo/temperature.py`: dead-lettered), schema-valid
   poison (`algo/poison.py`: dead-lettered alone, its batch-mates train) and groups too
   stale (`algo/staleness.py`: acked, not trained); the dispatcher is granted a replacement for each
   group whose task will not be trained on.
3. **refill** — a step short of the groups it set aside reads their replacements before it trains.
4. **dynamic sampling** (DAPO, `algorithm.dynamic_sampling`; the rule is `algo/group_filters.py`'s) — set
   aside groups whose advantages are all zero and read more until the step holds `groups_per_step`
   informative groups.

Every entry read is held until it is acked or dead-lettered (`holding`: the stream's `Held`); `ack` acks the committed and
set-aside ones together, after the loop's checkpoint (`ack(checkpointed=False)`, for a read that held only
groups set aside, acks those and leaves the committed ones for their checkpoint).

A group is trained at most once: the entries held are heartbeaten before each read (the stream's atomic
heartbeat: idle time reset, delivery count unchanged, only entries still this consumer's), so a
visibility timeout shorter than a step (or than `checkpoint.every` steps) does not make them look
abandoned, and a reclaim leaves the entries held out before it counts or buries anything; the replay filter checks each read against the task ids of the checkpoint *and* of every read
before it in the same step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from searchr1.core.metrics import in_stage
from searchr1.core.schemas import TrajectoryGroup
from searchr1.learner.algo.group_filters import split_flat_groups
from searchr1.learner.algo.poison import batch_problem, group_problem
from searchr1.learner.algo.staleness import Dropped, StalenessPolicy
from searchr1.learner.algo.temperature import temperature_mismatch
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.base import StepGroups
from searchr1.learner.sources.step_input import StepInput
from searchr1.learner.train.checkpoint import TrainState
from searchr1.streams import Held, TypedStream

log = logging.getLogger("searchr1.learner")


UNFILLABLE_AFTER_S = 10.0
"""How long a step must look unfillable (see `StreamSource.unfillable`) before its missing tasks are
replaced: a dispatcher's publish, or its replacement of a dead-lettered task, lands within a second or two."""
LOOK_EVERY_S = 2.0
"""How often a waiting read looks at the tasks stream (what it waits for, and whether it can fill)."""


class Grants(Protocol):
    """The source's view of the dispatcher (`learner/dispatcher.py`)."""

    @property
    def exhausted(self) -> bool:
        """The last epoch is published."""
        ...

    @property
    def budget(self) -> int | None:
        """Tasks still granted (None: not paced)."""
        ...

    def grant(self, n: int, version: int) -> None:
        """Allow `n` more tasks, stamped for `version`."""


class StreamSource:
    """The trajectories stream (consumer group `learner`) as the loop's group source, on rank 0."""

    def __init__(self, settings: LearnerSettings, trajectories: TypedStream[TrajectoryGroup],
                 tasks: TypedStream[Any], staleness: StalenessPolicy, metrics: LearnerMetrics, *,
                 vocab_size: int | None = None, dispatcher: Grants | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.s = settings
        self.clock = clock
        self.waiting_for = ""
        """What a read waits for, said in a line (the learner's watchdog names it when the wait outlasts its
        bound); empty while no read waits."""
        self._unfillable_since: float | None = None
        self._looked_at = float("-inf")
        self.trajectories = trajectories
        self.tasks = tasks
        self.staleness = staleness
        self.metrics = metrics
        self.dispatcher = dispatcher
        """The dispatcher feeding the tasks stream: granted replacement tasks (`grant(n, version)`), and
        asked whether it has published its last epoch (`exhausted`); None: nobody feeds the stream here."""
        self.unacked: list[str] = []
        """Ids of the entries set aside (replayed, stale, flat): acked with the next `ack`."""
        self.committed: list[str] = []
        """Ids of the entries trained on: acked with the next `ack` after a checkpoint."""
        self.vocab_size = vocab_size
        """The policy's vocabulary size: token ids at or past it are poison (None: not checked)."""
        self._step_tasks: set[str] = set()
        """Task ids of the groups kept by the reads of the step in hand (reset by `next_step`)."""
        self.held = Held(trajectories, settings.consumer)
        """The entries read and not yet acked or dead-lettered, heartbeaten before each read."""
        self._state = TrainState()

    async def start(self) -> None:
        """Create the consumer groups; the first read re-reads the entries still pending for this
        consumer (a learner restarted after a crash trains them at once, not after the visibility
        timeout: the run's lease makes this consumer name its own)."""
        await self.trajectories.ensure_group()
        await self.tasks.ensure_group()
        self.trajectories.reread_own_next()

    # ------------------------------------------------------------------ stages

    async def next_step(self, stop: asyncio.Event, state: TrainState) -> StepGroups | None:
        """Read, filter, refill and (DAPO) sample one step; None when stopped short of a full step."""
        self._state = state
        self._step_tasks = set()
        want = self.s.batch.groups_per_step
        got = await self.read_groups(stop)
        if stop.is_set() and len(got.entries) < want:
            return None  # no partial step on shutdown: the unacked groups are re-read after a restart
        got = await self.set_aside(got)
        # groups set aside leave the step short: read their replacements, or the step trains short and the
        # tasks of the groups it did not wait for are sampled a version early and dropped as stale
        while got.groups and len(got.groups) < want and not stop.is_set() and not await self.data_exhausted():
            got.merge(await self.set_aside(await self.read_groups(stop, want - len(got.groups))))
        if stop.is_set() and len(got.groups) < want:
            return None
        figures: dict[str, float] = {}
        if self.s.algorithm.dynamic_sampling:
            got = await self.sample_informative(got, stop, figures)
            if got is None:
                return None
        return StepGroups(got.groups, got.group_entry_ids(), figures)

    @in_stage("queue_wait", lambda self: getattr(self.metrics, "stages", None))
    async def read_groups(self, stop: asyncio.Event, want: int | None = None) -> StepInput:
        """Reclaim groups left unacked by a dead learner, then read new ones until a step's worth
        (`groups_per_step`, or `want`) is in hand or `stop` is set."""
        want = self.s.batch.groups_per_step if want is None else want
        got = StepInput()
        buried = self.trajectories.buried
        await self.heartbeat()
        reclaimed = await self.trajectories.reclaim(self.s.consumer, count=want, held=self.holding)
        got.entries.extend(e for e in reclaimed if e.id not in self.holding)  # held: in a step already
        self._unfillable_since, self._looked_at = None, float("-inf")
        while len(got.entries) < want and not stop.is_set():
            await self.look(len(got.entries), want)
            self.holding.update(e.id for e in got.entries)
            got.entries.extend(await self.trajectories.reread_own(self.s.consumer, self.holding,
                                                                  want - len(got.entries)))
            if len(got.entries) >= want:
                break
            got.entries.extend(await self.trajectories.read(
                self.s.consumer, count=want - len(got.entries), block_ms=self.s.read_block_ms))
            if len(got.entries) < want and await self.data_exhausted():
                break  # the last, partial step of the run
            buried = self.replace_buried(buried)
        self.holding.update(e.id for e in got.entries)
        self.replace_buried(buried)
        self.waiting_for = ""
        return got

    async def look(self, have: int, want: int) -> None:
        """Between the passes of a waiting read, every `LOOK_EVERY_S`: say what the read waits for, and
        replace what the step lacks once it has looked unfillable for `UNFILLABLE_AFTER_S`."""
        now = self.clock()
        if now - self._looked_at < LOOK_EVERY_S:
            return
        self._looked_at = now
        in_flight, unread = await self.tasks.in_flight(), await self.trajectories.lag()
        d = self.dispatcher
        budget = d.budget if d is not None else None
        self.waiting_for = (f"waiting for the groups of step {self._state.step + 1}: {have} of {want} read; "
                            f"{in_flight} task(s) queued or in rollout, {unread} group(s) unread"
                            + ("" if d is None else "; the dispatcher has published its last epoch" if d.exhausted
                               else f"; dispatcher budget {budget}" if budget is not None else ""))
        missing = self.unfillable(have, want, in_flight, unread)
        if not missing:
            self._unfillable_since = None
            return
        if self._unfillable_since is None:
            self._unfillable_since = now
            return
        if now - self._unfillable_since < UNFILLABLE_AFTER_S:
            return
        log.error("step %d cannot fill: %s, and no task is left to publish that would fill it (the tasks it "
                  "waits for were lost: Redis lost data, or a replacement was missed); publishing %d "
                  "replacement task(s)", self._state.step + 1, self.waiting_for, missing)
        self.metrics.tasks_replaced.labels("unfillable").inc(missing)
        self.grant(missing, self._state.version)
        self._unfillable_since = None

    def unfillable(self, have: int, want: int, in_flight: int, unread: int) -> int:
        """Groups the step in hand lacks that nothing can bring: a paced dispatcher with no task left to
        publish before this step trains (budget 0, epochs not done), no task queued or in rollout, no group
        unread. 0 otherwise (something is on its way, or the dispatcher will publish it)."""
        d = self.dispatcher
        if d is None or d.exhausted or d.budget is None or d.budget > 0 or in_flight or unread:
            return 0
        return max(0, want - have)

    def replace_buried(self, before: int) -> int:
        """Grant a replacement task for each group the stream dead-lettered on its own since its count
        was `before` (malformed, or delivered `max_deliveries` times): its task is never trained on, and
        a step waiting for it would wait for good. Returns the count now."""
        now = self.trajectories.buried
        if now > before:
            log.warning("%d group(s) dead-lettered by the trajectories stream (malformed, or delivered "
                        "max_deliveries times): their tasks are replaced", now - before)
            self.metrics.tasks_replaced.labels("group_dead_lettered").inc(now - before)
            self.grant(now - before, self._state.version)
        return now

    def filter_groups(self, got: StepInput) -> StepInput:
        """Set aside replays of task ids already trained on, groups sampled at another temperature than
        the learner's, and groups too stale under the staleness policy."""
        fresh = []
        seen = self._step_tasks
        for e in got.entries:
            tid = e.value.task.task_id
            if tid in seen or tid in self._state.consumed:
                got.replays.append(e)
            elif (reason := temperature_mismatch(e.value)) is not None:
                got.wrong_temperature.append(Dropped(e, reason))
            elif (reason := group_problem(e.value, self.vocab_size)
                  or batch_problem(e.value, max_seq_len=self.s.batch.max_seq_len)) is not None:
                got.poison.append(Dropped(e, reason))
            else:
                seen.add(tid)
                fresh.append(e)
        kept, got.stale = self.staleness.split(fresh, self._state.version, group=lambda e: e.value)
        got.groups = [e.value for e in kept]
        self.metrics.dropped.labels("replay").inc(len(got.replays))
        self.metrics.dropped.labels("stale").inc(len(got.stale))
        self.metrics.dropped.labels("temperature").inc(len(got.wrong_temperature))
        self.metrics.dropped.labels("poison").inc(len(got.poison))
        for d in got.stale:
            log.info("dropping group of task %s: %s", d.item.value.task.task_id, d.reason)
        # replace the tasks that will not be trained on; a replay's task was trained (and replaced) already:
        # granting for it too would put the dispatcher one task ahead for the rest of the run
        self.grant(got.untrained_tasks, self._state.version)
        return got

    async def set_aside(self, got: StepInput) -> StepInput:
        """Filter one read, dead-letter, and queue the replays and stale groups for the next ack (replays
        were checkpointed already; stale ones are never trained on)."""
        got = self.filter_groups(got)
        await self.dead_letter(got)
        self.unacked.extend(e.id for e in got.replays)
        self.unacked.extend(d.item.id for d in got.stale)
        return got

    async def dead_letter(self, got: StepInput) -> None:
        """Move the groups that can never be trained on to the dead stream, with the reason."""
        for d in got.wrong_temperature + got.poison:
            log.warning("dead-lettering group of task %s: %s", d.item.value.task.task_id, d.reason)
            await self.trajectories.dead_letter(d.item.id, d.reason)
            self.holding.discard(d.item.id)

    async def reject(self, entry_id: str, reason: str) -> None:
        """Dead-letter one group the loop refused to train (a desynced worker's), with the reason; its task
        is granted a replacement."""
        await self.trajectories.dead_letter(entry_id, reason)
        self.holding.discard(entry_id)
        self.metrics.dropped.labels("desync").inc()
        self.grant(1, self._state.version)

    async def sample_informative(self, got: StepInput, stop: asyncio.Event,
                                 figures: dict[str, float]) -> StepInput | None:
        """DAPO dynamic sampling: set aside groups whose advantages are all zero (acked with the step,
        replaced by the dispatcher, never trained on) and read more until the step has `groups_per_step`
        informative groups; their counts go into `figures`. Raises after `dynamic_sampling_max_batches`
        reads that did not fill a step; None when stopped first."""
        a, want = self.s.algorithm, self.s.batch.groups_per_step
        acc, reads, flat, solved = StepInput(), 0, 0, 0
        part: StepInput = got
        while True:
            reads += 1
            split = split_flat_groups(part.groups)
            flat_ids = {id(g) for g in split.flat}
            self.unacked.extend(e.id for e in part.entries if id(e.value) in flat_ids)
            part.entries = [e for e in part.entries if id(e.value) not in flat_ids]
            part.groups = split.informative
            acc.merge(part)
            flat, solved = flat + len(split.flat), solved + split.all_solved
            self.metrics.dropped.labels("flat").inc(len(split.flat))
            for g in split.flat:  # the audit's record of a group acked untrained (its entry may be trimmed)
                log.info("dropping group of task %s: equal rewards (dynamic sampling)", g.task.task_id)
            self.grant(len(split.flat), self._state.version)
            if len(acc.groups) >= want or await self.data_exhausted():
                break
            if stop.is_set():
                return None
            if reads >= a.dynamic_sampling_max_batches:
                raise RuntimeError(
                    f"dynamic sampling read {reads} batches and found {len(acc.groups)} of the {want} groups "
                    f"with non-zero advantages a step needs ({flat} groups had equal rewards, {solved} of "
                    "them all solved): the policy solves every task or none; raise "
                    "dynamic_sampling_max_batches, change the data, or turn dynamic_sampling off")
            part = await self.set_aside(await self.read_groups(stop, want - len(acc.groups)))
        figures.update(flat_groups=float(flat), flat_all_solved=float(solved),
                       flat_all_failed=float(flat - solved), sampling_reads=float(reads))
        return acc

    def commit(self, entry_ids: Sequence[str]) -> None:
        self.committed.extend(e for e in entry_ids if e)

    async def ack(self, checkpointed: bool = True) -> None:
        """Ack the entries set aside, and (`checkpointed`) those trained on."""
        ids = self.unacked + (self.committed if checkpointed else [])
        if ids:
            await self.trajectories.ack(*ids)
        self.holding.difference_update(ids)
        self.unacked.clear()
        if checkpointed:
            self.committed.clear()

    @property
    def holding(self) -> set[str]:
        """Ids of the entries read and not yet acked or dead-lettered."""
        return self.held.ids

    async def heartbeat(self) -> None:
        """Reset the idle time of every entry held (the stream's atomic heartbeat: only entries still this
        consumer's, delivery count unchanged), so a reclaim never mistakes them for a dead learner's and
        an entry another learner reclaimed is never taken back."""
        await self.held.beat()

    def grant(self, trained: int, version: int) -> None:
        """Let the dispatcher publish the tasks the staleness policy grants for `trained` groups (or
        groups set aside), stamped for `version`."""
        if self.dispatcher is not None:
            self.dispatcher.grant(self.staleness.grant(trained), version)

    async def data_exhausted(self) -> bool:
        """True when the dispatcher has published its last epoch and every task and group is consumed."""
        if self.dispatcher is None or not self.dispatcher.exhausted:
            return False
        return await self.tasks.in_flight() == 0 and await self.trajectories.lag() == 0

    async def finished(self) -> bool:
        return await self.data_exhausted() and await self.trajectories.pending() == 0

    def settled(self, task_id: str) -> bool:
        """Whether a group of `task_id` was trained or is kept for the step in hand (the dispatcher asks
        before it replaces a dead-lettered task)."""
        return task_id in self._state.consumed or task_id in self._step_tasks

    async def lag(self) -> int:
        """Groups published on the trajectories stream and not yet read (the dispatcher's backpressure)."""
        return await self.trajectories.lag()
