"""The dispatcher (inside the learner process): feeds the tasks stream from a dataset, epoch-shuffled with
a seed (epoch e uses `seed + e`, so a resumed run reproduces the order), keeping at most `max_inflight`
tasks ahead of the learner (backpressure): tasks undelivered or unacked on the tasks stream, plus — given
the learner's group source as `downstream` (`Backlog`: its `lag`) — groups published and not yet read by
the learner. A stalled
learner thus stops the dispatcher, and the trajectories stream stops growing, at `max_inflight`. Groups
the learner has read and not yet acked (they wait for a checkpoint) do not count: they are in its hands.

Task ids are `{dataset id}@e{epoch}`, so one question is trained once per epoch and replays are
recognised. Its position `{epoch, cursor}` is saved in learner checkpoints (and `restore`d from them); tasks published after the
last checkpoint are published again after a crash and skipped by the learner as already consumed if
their groups were trained on.

Dead-lettered tasks (`tools/dead_tasks.py`, given as `dead`): each pass reads what the rollout workers
buried on the tasks stream since the last (`max_deliveries` deliveries without an ack: a poison question, a
reward service down past three deliveries) and, under a paced policy, publishes one replacement for each
task this dispatcher published (its entry at or after this dispatcher's first) whose group the learner does
not hold already (a task published again after a restart may be buried while its first copy's group is
trained), so a step counting on it still fills; without a budget `max_inflight` refills by itself, the buried entry being acked. Tasks
dead-lettered at any time in the run are recorded on disk and skipped when the dispatcher meets them
again (a restart publishes again from the checkpoint's position): a poison task is buried once, not once
per restart. `on_replace(n)` counts the replacements.

Staleness: the rule is the learner's `StalenessPolicy` (`algo/staleness.py`); the dispatcher applies its
mechanical half. With a paced policy it publishes only the tasks it has been granted (starting from the
policy's initial budget; the learner calls `grant` with the tasks the policy grants and its new version
after each step), and every task carries the policy's `min_policy_version` for the version the learner
last reported. Training tasks are stamped with the learner's training temperature (`algo/temperature.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from typing import Protocol

from searchr1.core.datasets import Question
from searchr1.core.schemas import Task
from searchr1.learner.algo.staleness import StalenessPolicy
from searchr1.learner.algo.temperature import task_sampling
from searchr1.learner.settings import DispatcherSettings
from searchr1.learner.tools.dead_tasks import DeadTasks
from searchr1.streams import TypedStream, parse_id

log = logging.getLogger("searchr1.learner")


class Backlog(Protocol):
    """What the dispatcher reads its downstream backpressure from: the learner's group source (or the
    trajectories stream itself)."""

    async def lag(self) -> int:
        """Groups published and not yet read by the learner."""
        ...


class Settled(Protocol):
    """The learner's group source, asked about a dead-lettered task before it is replaced."""

    def settled(self, task_id: str) -> bool:
        """The learner holds a group of `task_id` already (trained, or read for the step in hand): a copy
        of the task published again after a restart was buried, not the work."""
        ...


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The dataset order of `epoch` (a seeded permutation)."""
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    return order


class Dispatcher:
    """Publishes `Task`s to `stream` while `stream.in_flight() < max_inflight` (and, under a paced
    `staleness` policy, while granted). `version` is the learner's version at start; without a policy
    tasks are neither paced nor stamped with a minimum version."""

    def __init__(self, stream: TypedStream[Task], specs: Sequence[Question], settings: DispatcherSettings,
                 *, epoch: int = 0, cursor: int = 0, on_publish=None, staleness: StalenessPolicy | None = None,
                 version: int = 0, vocab_size: int | None = None, record=None, dead: DeadTasks | None = None,
                 on_replace: Callable[[int], None] | None = None) -> None:
        if not specs:
            raise ValueError("the dispatcher needs at least one task")
        self.stream = stream
        self.specs = list(specs)
        self.s = settings
        self.epoch = epoch + cursor // len(self.specs)
        self.cursor = cursor % len(self.specs)
        self.on_publish = on_publish
        self.staleness = staleness
        self.budget = staleness.initial_budget() if staleness is not None else None
        """Tasks still granted (None = not paced)."""
        self.min_policy_version = staleness.min_policy_version(version) if staleness is not None else 0
        """Stamped on every task published from now on; raised as the learner reports new versions."""
        self._order = epoch_order(len(self.specs), settings.seed, self.epoch)
        self.vocab_size = vocab_size
        """The policy's vocabulary size, stamped on every task (None: not known, not stamped)."""
        self.record = record
        """Called (in a thread) with the ids of each batch once published: the run's durable dispatch record
        (`tools/dispatch_log.py`), which the audit reads where trimming deleted the stream's entries."""
        self.dead = dead
        """The tasks dead-lettered on the tasks stream (None: not watched)."""
        self.on_replace = on_replace
        self.first_entry: tuple[int, int] | None = None
        """The tasks stream entry id of this dispatcher's first publish: a burial of an entry before it is
        of a task an earlier learner published (the restart's budget covers it already)."""
        self.skipped = 0
        """Tasks skipped because they were dead-lettered before."""
        self.replaced = 0
        """Replacements published for dead-lettered tasks."""

    @property
    def exhausted(self) -> bool:
        return self.epoch >= self.s.epochs

    def grant(self, n: int, version: int) -> None:
        """Allow `n` more tasks (no budget: no-op) now that the learner is at `version`; tasks published
        from now on carry the policy's `min_policy_version` for it."""
        if self.staleness is None:
            return
        self.min_policy_version = max(self.min_policy_version, self.staleness.min_policy_version(version))
        if self.budget is not None:
            self.budget += max(0, n)

    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def restore(self, position: dict[str, int], version: int) -> None:
        """Resume from a checkpoint: its saved `position` (empty: the start) and the learner's `version`."""
        cursor = position.get("cursor", 0)
        self.epoch = position.get("epoch", 0) + cursor // len(self.specs)
        self.cursor = cursor % len(self.specs)
        self._order = epoch_order(len(self.specs), self.s.seed, self.epoch)
        if self.staleness is not None:
            self.min_policy_version = self.staleness.min_policy_version(version)

    def _next(self) -> Task:
        spec = self.specs[self._order[self.cursor]]
        task = Task(
            task_id=f"{spec.task_id}@e{self.epoch}", question=spec.question, golden_answers=spec.golden_answers,
            data_source=spec.data_source, group_size=self.s.group_size, epoch=self.epoch,
            min_policy_version=self.min_policy_version,
            sampling=task_sampling(self.s.top_p), metadata=spec.metadata, vocab_size=self.vocab_size,
        )
        self.cursor += 1
        if self.cursor >= len(self.specs):
            self.epoch += 1
            self.cursor = 0
            self._order = epoch_order(len(self.specs), self.s.seed, self.epoch)
        return task

    async def in_flight(self, downstream: Backlog | None = None) -> int:
        """Tasks ahead of the learner: queued or rolling out, or (given `downstream`) rolled out and not
        yet read."""
        ahead = await self.stream.in_flight()
        if downstream is not None:
            ahead += await downstream.lag()
        return ahead

    async def fill(self, downstream: Backlog | None = None) -> int:
        """Publish until `max_inflight` tasks are ahead or the epochs are done; returns how many."""
        room = self.s.max_inflight - await self.in_flight(downstream)
        if self.budget is not None:
            room = min(room, self.budget)
        batch = []
        known_dead = self.dead.known if self.dead is not None else set()
        while room > 0 and not self.exhausted:
            task = self._next()
            if task.task_id in known_dead:  # dead-lettered before: skipped, the next task takes its place
                self.skipped += 1
                continue
            batch.append(task)
            room -= 1
        if batch:
            if self.budget is not None:
                self.budget -= len(batch)
            ids = await self.stream.publish_many(batch)
            if self.first_entry is None and ids:
                self.first_entry = parse_id(ids[0])
            if self.record is not None:
                await asyncio.to_thread(self.record, [t.task_id for t in batch])
            if self.on_publish:
                self.on_publish(len(batch))
        return len(batch)

    async def replace_dead(self, downstream: Backlog | None = None) -> int:
        """Read the tasks dead-lettered since the last call; under a paced policy grant one replacement for
        each this dispatcher published whose group the learner does not hold already (`downstream`'s
        `settled`, when it has one). Returns how many were granted."""
        if self.dead is None:
            return 0
        settled = getattr(downstream, "settled", None)
        granted = 0
        for d in await self.dead.poll():
            mine = self.first_entry is not None and parse_id(d.entry_id) >= self.first_entry
            if mine and d.task_id is not None and settled is not None and settled(d.task_id):
                mine = False  # its group was trained or is in hand: a replacement would put one task too many ahead
            log.warning("task %s dead-lettered on the tasks stream (%s): %s", d.task_id or f"entry {d.entry_id}",
                        d.reason, "replaced" if mine and self.budget is not None else
                        "not published again" if d.task_id is not None else "its id is lost")
            if mine and self.budget is not None:
                self.budget += 1
                granted += 1
        if granted:
            self.replaced += granted
            if self.on_replace is not None:
                self.on_replace(granted)
        return granted

    async def run(self, stop: asyncio.Event, downstream: Backlog | None = None) -> None:
        """Keep the stream filled until `stop` is set or the dataset is exhausted, counting `downstream`'s
        backlog as tasks ahead, and replace the tasks dead-lettered meanwhile."""
        await self.stream.ensure_group()
        if self.dead is not None:
            await self.dead.start()
        while not stop.is_set() and not self.exhausted:
            await self.replace_dead(downstream)
            await self.fill(downstream)
            # `stop` is how this loop ends: a cancellation can be lost inside a redis-py command
            # (core.aio.stop_task), which once left it running after the learner had finished
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.s.poll_s):
                    await stop.wait()
