"""The rollout worker: one loop that reads top to bottom as named stages,

    read task → sample the group (G trajectories, concurrently) → score → publish → ack,

with up to `tasks.max_concurrent` tasks in flight over one engine, plus the chores between tasks:
reclaiming tasks a dead worker left unacked, and moving to a newer weight version (admission stops,
in-flight groups finish under the old version, the engine reloads, admission resumes — so every group
is tagged with the one version that generated all of it; with `weights.partial_rollouts`, in-flight
turns are interrupted instead and resume under the new weights, each token tagged with its version:
`partial.py`). The move happens every `weight_poll_s`, and
at once when newly read tasks find newer weights announced (always so when a task needs a newer version
than the engine runs: `Task.min_policy_version`), so that every task starts under the newest weights.
That catch-up is the worker's whole part in staleness, and a mechanical one: the learner decides what
`min_policy_version` a task carries and which groups are too stale to train on (`learner/algo/staleness.py`;
docs/learner.md, "Staleness").

Sampling and scoring one task's group (its sampling params, the G trajectories, the reward service) is
`GroupSampler`'s (`sampler.py`); the worker hands it each task it admits.

Failure rules: a retriever that stays unavailable past the client's retry deadline ends that trajectory
with finish reason `retriever_unavailable`, a spent web search budget with `search_budget`, a refused
search with `error` (the group is still published; the learner may drop it); a reward or publish
failure leaves the task unacked, so it is redelivered after the visibility timeout and dead-lettered
after `max_deliveries`. A dead engine
(`GeneratorDead`) is fatal: the worker takes no more tasks, drains, and `run` raises it (the process
exits 1 for its supervisor to restart; the tasks it held are redelivered). SIGTERM drains:
no new tasks, in-flight groups finish, are published and acked (those not done within
`drain_timeout_s` are abandoned and released: pending with an idle time past the visibility timeout, so
another worker's next reclaim takes them at once), then the worker exits 0. Redis away: the
streams' `RedisLink` makes every read, publish and ack wait for it (a task is acked only after its
group is published), and once Redis is back the worker first re-reads the tasks still pending for it
that it does not hold (a read whose reply the outage lost).

Every task read is held until it is acked or given up, and a heartbeat task resets the idle time of
the tasks held every `heartbeat_s` (a quarter of the visibility timeout) from the read on — through a
weight load the task waits for, a drain, a partial-rollout swap — so another worker reclaims a task only
from a worker that stopped heartbeating (dead, or hung past the timeout): `searchr1.streams.Held`. The
heartbeat is supervised (`searchr1.core.supervise`): should it die, the worker takes no more tasks,
drains and `run` raises `TaskDied` (exit 1), instead of working on tasks other workers reclaim under it.

What the worker does not do: decide how many tasks exist (the learner's dispatcher) or train.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from searchr1.core.faults import NO_FAULTS, Faults
from searchr1.core.schemas import Task, TrajectoryGroup
from searchr1.core.supervise import Supervisor
from searchr1.core.watchdog import Watchdog
from searchr1.rollout.engine import GeneratorDead
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.rollout.partial import InterruptibleGenerator
from searchr1.rollout.sampler import GroupSampler
from searchr1.rollout.settings import TaskSettings
from searchr1.streams import Entry, Held, TypedStream
from searchr1.weightsync import LoadSettings, WeightLoader

log = logging.getLogger("searchr1.rollout.worker")


def _dead_generator(exc: BaseException) -> GeneratorDead | None:
    """The `GeneratorDead` inside `exc` (itself, a cause, or one of an exception group's), if any."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, GeneratorDead):
            return e
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]
        if isinstance(e, BaseExceptionGroup):
            todo += list(e.exceptions)
    return None


@dataclass
class Worker:
    """Consumes tasks, publishes scored groups, keeps the weights fresh."""

    sampler: GroupSampler
    tasks: TypedStream[Task]
    groups: TypedStream[TrajectoryGroup]
    loader: WeightLoader
    metrics: RolloutMetrics
    worker_id: str
    settings: TaskSettings = field(default_factory=TaskSettings)
    """`[rollout.tasks]`: how many tasks at once (`max_concurrent`), how long a read blocks, how often idle
    tasks are looked for, how long a drain may take."""
    weights: LoadSettings = field(default_factory=LoadSettings)
    """`[rollout.weights]`: how often the announced version is checked (`poll_interval_s`)."""
    heartbeat_s: float | None = None
    """How often the tasks held are heartbeaten (None: never; the service beats every quarter of the
    visibility timeout)."""
    watchdog: Watchdog | None = None
    partial: InterruptibleGenerator | None = None
    """Set (the sampler's engine, wrapped): weight swaps interrupt in-flight turns instead of draining."""
    faults: Faults = NO_FAULTS
    """The fault suite's hook (`rollout.poison_group`, `rollout.poison_task`, `rollout.after_publish`); never
    fires outside it."""
    _inflight: set[asyncio.Task] = field(default_factory=set)
    _inflight_ids: set[str] = field(default_factory=set)
    _entry_ids: dict[asyncio.Task, str] = field(default_factory=dict)  # task in flight → its stream entry
    _held: Held[Task] = field(init=False)
    """The tasks read and not yet acked or given up: heartbeaten from read to ack, through weight loads,
    swaps and drains (`searchr1.streams.Held`)."""
    _seq: int = 0
    _next_reclaim: float = 0.0
    _next_weights: float = 0.0
    _next_lag: float = 0.0
    _fatal: GeneratorDead | None = None

    def __post_init__(self) -> None:
        self._held = Held(self.tasks, self.worker_id)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then drain (finish, publish and ack in-flight tasks)."""
        await self.tasks.ensure_group()
        await self.groups.ensure_group()
        self.metrics.weight_version.set(self.loader.version)
        self._next_reclaim = 0.0
        self._next_weights = 0.0
        tasks = Supervisor("rollout worker")
        if self.heartbeat_s is not None:
            tasks.spawn("heartbeat of held tasks", self._held.keep_beating(self.heartbeat_s))
        try:
            while not stop.is_set() and self._fatal is None and tasks.failure is None:
                try:
                    await self._step()
                except (RedisError, OSError) as exc:  # Redis restarting / unreachable: wait and retry
                    log.error("redis error in the worker loop (retrying in 1 s): %s", exc)
                    await asyncio.sleep(1.0)
        finally:
            try:
                await self._drain(self.settings.drain_timeout_s)
            finally:
                await tasks.close()
        if self._fatal is not None:  # after the drain: every task still held stays unacked for redelivery
            raise self._fatal
        tasks.check()  # the heartbeat died: its tasks would be reclaimed under the worker

    async def _step(self) -> None:
        """One pass: new weights? → reclaim idle tasks → read new tasks → start them."""
        if self.watchdog is not None:
            self.watchdog.beat()
        now = time.monotonic()
        if now >= self._next_weights:
            await self._move_to_announced_weights()
        slots = self.settings.max_concurrent - len(self._inflight)
        if slots <= 0:
            await asyncio.wait(self._inflight, timeout=self.settings.block_ms / 1000,
                               return_when=asyncio.FIRST_COMPLETED)
            return
        entries = await self.tasks.reread_own(self.worker_id, self._held.ids, slots)
        if not entries and now >= self._next_reclaim:
            self._next_reclaim = now + self.settings.reclaim_interval_s
            reclaimed = await self.tasks.reclaim(self.worker_id, slots, held=self._held.ids)
            # our own slow tasks look idle too: claiming them resets their idle time, nothing more
            entries = [e for e in reclaimed if e.id not in self._inflight_ids]
            for e in entries:
                log.warning("reclaimed task %s (delivery %d)", e.value.task_id, e.deliveries)
        if not entries:
            block = self.settings.block_ms if not self._inflight else min(self.settings.block_ms, 50)
            entries = await self.tasks.read(self.worker_id, count=slots, block_ms=block)
        self._held.hold(e.id for e in entries)  # heartbeaten from here, through a load for them
        try:
            if entries and (max(e.value.min_policy_version for e in entries) > self.loader.version
                            or await self.loader.newer() is not None):
                # start new tasks under the newest announced weights, not the ones until the next poll: a
                # group sampled with the previous version arrives a version staler still, and past
                # `max_staleness` the learner drops it (in synchronous training, every step's first tasks)
                await self._move_to_announced_weights()
        except BaseException:
            self._held.drop(e.id for e in entries)  # not started: left for redelivery
            raise
        for e in entries:
            self._start(e)
        await self._update_lag()

    async def _move_to_announced_weights(self) -> None:
        """If newer weights are announced: let in-flight groups finish under the old version (or, with
        partial rollouts, interrupt their turns), then load them (no-op, bar one Redis read, when nothing
        newer is announced yet)."""
        self._next_weights = time.monotonic() + self.weights.poll_interval_s
        why = await self.loader.take_resync(self.worker_id)
        if why is not None:  # the learner set this worker's groups aside: reload whatever is announced
            log.error("re-sync requested by the learner (%s): reloading the announced weights", why)
            await self._drain()
            await self.loader.resync()
            return
        if await self.loader.newer() is None:
            return
        if self.partial is not None:
            await self.partial.swap(self.loader.maybe_update, lambda: self.loader.version)
            return
        await self._drain()
        await self.loader.maybe_update()

    async def _update_lag(self) -> None:
        now = time.monotonic()
        if now < self._next_lag:  # on Redis < 7 `lag` scans the undelivered entries: at most once a second
            return
        self._next_lag = now + 1.0
        try:
            self.metrics.task_queue_lag.set(await self.tasks.lag())
        except Exception as exc:  # noqa: BLE001 - metrics only; never fail the loop over them
            log.debug("cannot read the task queue lag: %s", exc)

    def _start(self, entry: Entry[Task]) -> None:
        self._seq += 1
        task = asyncio.create_task(self._handle(entry, f"{self.worker_id}-{self._seq}"))
        self._inflight.add(task)
        self._inflight_ids.add(entry.id)
        self._entry_ids[task] = entry.id
        self.metrics.inflight_tasks.set(len(self._inflight))

        def _done(t: asyncio.Task) -> None:
            self._inflight.discard(t)
            self._inflight_ids.discard(entry.id)
            self._entry_ids.pop(t, None)
            self._held.drop([entry.id])
            self.metrics.inflight_tasks.set(len(self._inflight))

        task.add_done_callback(_done)

    async def _drain(self, timeout: float | None = None) -> None:
        """Wait for the tasks in flight (the heartbeat keeps them held meanwhile); those still running after
        `timeout` seconds are cancelled and stay unacked (redelivered)."""
        if not self._inflight:
            return
        running = list(self._inflight)
        _, late = await asyncio.wait(running, timeout=timeout)
        if late:
            held = {self._entry_ids[t] for t in late if t in self._entry_ids}
            for t in late:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            released = await self._held.release(held)
            log.info("%d task(s) still in flight after the %.0f s drain: abandoned, %d released for another "
                     "worker to take at once", len(late), timeout or 0.0, released)
            return
        await asyncio.gather(*running, return_exceptions=True)

    async def _handle(self, entry: Entry[Task], prefix: str) -> None:
        """read → sample + score → publish → ack, for one task."""
        t0 = time.perf_counter()
        task = entry.value
        stage = "rollout"
        try:
            if self.faults.fires_for("rollout.poison_task", task.task_id):  # the fault suite's hook
                raise RuntimeError(f"task {task.task_id} is poison (fault point rollout.poison_task)")
            group = await self.sampler.sample_group(task, self.loader.version, self.worker_id, prefix)
            stage = "publish"
            group.timings["total"] = time.perf_counter() - t0
            group = self.faults.poisoned(group)  # the fault suite's hook: `group` itself outside it
            with self.metrics.stages.stage("publish"):
                await self.groups.publish(group)
                self.faults.kill_at("rollout.after_publish")  # the fault suite's hook: never fires outside it
                stage = "ack"
                await self.tasks.ack(entry.id)
        except Exception as exc:  # noqa: BLE001 - any failure leaves the task for redelivery
            self.metrics.task_failures.labels(stage).inc()
            log.error("task %s failed at %s (left unacked for redelivery): %s", task.task_id, stage, exc)
            dead = _dead_generator(exc)
            if dead is not None and self._fatal is None:
                log.critical("the generation engine died (%s): taking no more tasks; exiting for a restart", dead)
                self._fatal = dead
            return
        self.metrics.groups.inc()
        self.metrics.group_seconds.observe(time.perf_counter() - t0)
        log.info("task %s: %d trajectories, mean reward %.3f, version %d, %.2f s", task.task_id,
                 len(group.trajectories), sum(group.rewards) / len(group.rewards), group.policy_version,
                 group.timings["total"])
