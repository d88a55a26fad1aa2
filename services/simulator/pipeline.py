"""A discrete-event model of searchr1's training pipeline: the dispatcher's paced tasks, rollout workers
(each a processor-sharing engine, `engine.py`), searches, scoring, the learner's steps and weight sync,
under the staleness bound. Pure: parameters in, a timeline out; the clock is the event loop's own.

It follows the code's rules (docs/learner.md, "Staleness"; `rollout/worker.py`):

- the dispatcher publishes `(k + 1) × groups_per_step` tasks at the start and `groups_per_step` more
  after each step (one more per group dropped as stale), each stamped `min_policy_version = max(0, v − k)`
  for the learner's version v at the time;
- a worker holds at most `max_concurrent` groups; a task that needs newer weights than it runs, or a
  newer version announced at its poll (every `weight_poll_s`), makes it stop taking tasks, let its groups
  finish, reload (`reload_s`) and go on; every trajectory of a group runs its turns on the worker's
  engine, with a search (`search_s`) between turns; a finished group is scored and published
  (`group_s`);
- the learner takes groups in the order they were published, drops those more than k versions behind
  (and reads replacements) until it has a step's worth, trains (`train_s(tokens)`, then `overhead_s`
  and `publish_s`), announces version v + 1 and grants the next tasks.

What it leaves out: failures and redeliveries, the retriever's batching (a search takes `search_s`
whatever else is searching), and the scheduling latency of the processes' own loops.
"""

from __future__ import annotations

import heapq
import itertools
import random
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from searchr1.simulator.engine import Engine
from searchr1.simulator.workload import Trajectory, Workload, sample


@dataclass(frozen=True)
class Pipeline:
    """The shape of a run (its config)."""

    workers: int
    groups_per_step: int
    group_size: int
    max_staleness: int
    max_concurrent: int = 8
    """Groups one worker rolls out at once (`rollout.tasks.max_concurrent`)."""
    weight_poll_s: float = 2.0
    """How often a worker checks for newer weights (`rollout.weights.poll_interval_s`)."""
    newest_on_read: bool = True
    """The worker's rule: it moves to the newest announced weights before starting tasks it reads. False:
    a what-if in which it moves only at its poll, or when a task's minimum version requires it."""


@dataclass(frozen=True)
class Times:
    """What each stage costs (measured, or modelled for a GPU shape)."""

    engine: Callable[[], Engine]
    """A fresh engine for one worker."""
    train_s: Callable[[int], float]
    """The learner's forward/backward and optimizer for a step of this many trained tokens."""
    overhead_s: float = 0.0
    """The learner's other per-step work: checkpoint, archive, batching, logging."""
    publish_s: float = 0.0
    """Exporting and announcing the weights after a step."""
    reload_s: float = 0.0
    """A worker's fetch, verify and reload of a new version."""
    search_s: float = 0.0
    """One search, from the turn's end to the next turn's start."""
    group_s: float = 0.0
    """Scoring and publishing a finished group."""


@dataclass
class Result:
    step_end_s: list[float]
    """When each step's weights were announced."""
    learner_busy_s: float
    rollout_busy_s: list[float]
    """Per worker: engine busy (generating or prefilling) + reloading."""
    reloads: int
    staleness: list[int] = field(default_factory=list)
    """Per trained group: versions between its weights and the learner's."""
    dropped: int = 0

    @property
    def wall_s(self) -> float:
        return self.step_end_s[-1] if self.step_end_s else 0.0

    @property
    def seconds_per_step(self) -> float:
        return self.wall_s / max(1, len(self.step_end_s))

    def steady_seconds_per_step(self, skip: int = 1) -> float:
        """Seconds per step past the first `skip` steps (the pipeline filling)."""
        ends = self.step_end_s
        if len(ends) <= skip + 1:
            return self.seconds_per_step
        return (ends[-1] - ends[skip]) / (len(ends) - 1 - skip)

    @property
    def learner_idle_share(self) -> float:
        return 1.0 - self.learner_busy_s / self.wall_s if self.wall_s else 0.0

    @property
    def rollout_idle_share(self) -> float:
        if not self.wall_s or not self.rollout_busy_s:
            return 0.0
        return 1.0 - statistics.fmean(self.rollout_busy_s) / self.wall_s

    @property
    def mean_staleness(self) -> float:
        return statistics.fmean(self.staleness) if self.staleness else 0.0


@dataclass
class _Group:
    gid: int
    worker: int
    version: int
    trajectories: list[Trajectory]
    left: int
    tokens: int


@dataclass
class _Worker:
    engine: Engine
    version: int = 0
    groups: set[int] = field(default_factory=set)
    held: list[int] = field(default_factory=list)
    """Tasks read, waiting for a reload (their min_policy_version)."""
    draining: bool = False
    reloading: bool = False
    reload_s: float = 0.0
    epoch: int = 0


class _Sim:
    def __init__(self, p: Pipeline, t: Times, w: Workload, steps: int, seed: int) -> None:
        self.p, self.t, self.w, self.steps = p, t, w, steps
        self.rng = random.Random(seed)
        self.now = 0.0
        self.events: list[tuple[float, int, str, tuple]] = []
        self.seq = itertools.count()
        self.workers = [_Worker(t.engine()) for _ in range(p.workers)]
        self.tasks: deque[int] = deque()
        """min_policy_version of each published, unread task."""
        self.announced = 0
        self.version = 0
        self.learner_busy = False
        self.learner_busy_s = 0.0
        self.queue: deque[_Group] = deque()
        self.kept: list[_Group] = []
        self.groups: dict[int, _Group] = {}
        self.gids = itertools.count()
        self.traj_of: dict[int, tuple[int, int, int]] = {}
        """Engine sequence → (group, trajectory index, turn)."""
        self.seqs = itertools.count()
        self.result = Result([], 0.0, [], 0)
        self.publish(p.groups_per_step * (p.max_staleness + 1))
        for i in range(p.workers):
            self.at(p.weight_poll_s, "poll", i)

    def at(self, when: float, kind: str, *args) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, args))

    def publish(self, n: int) -> None:
        self.tasks.extend([max(0, self.version - self.p.max_staleness)] * n)
        for i in range(len(self.workers)):
            self.admit(i)

    # ------------------------------------------------------------------ rollout

    def admit(self, i: int) -> None:
        wk = self.workers[i]
        if wk.reloading:
            return
        if wk.draining:
            if not wk.groups:
                self.reload(i)
            return
        slots = self.p.max_concurrent - len(wk.groups)
        if slots <= 0 or not self.tasks:
            return
        read = [self.tasks.popleft() for _ in range(min(slots, len(self.tasks)))]
        if max(read) > wk.version or (self.p.newest_on_read and self.announced > wk.version):
            wk.held, wk.draining = read, True
            self.admit(i)
            return
        for _ in read:
            self.start_group(i)

    def reload(self, i: int) -> None:
        wk = self.workers[i]
        wk.draining, wk.reloading = False, True
        self.at(self.now + self.t.reload_s, "reloaded", i, self.announced)

    def reloaded(self, i: int, target: int) -> None:
        wk = self.workers[i]
        wk.reloading, wk.version = False, target
        self.result.reloads += 1
        wk.reload_s += self.t.reload_s
        held, wk.held = wk.held, []
        for _ in held:  # a task's minimum is never above the version announced before it was published
            self.start_group(i)
        self.admit(i)

    def poll(self, i: int) -> None:
        wk = self.workers[i]
        if self.announced > wk.version and not (wk.reloading or wk.draining):
            wk.draining = True
            self.admit(i)
        self.at(self.now + self.p.weight_poll_s, "poll", i)

    def start_group(self, i: int) -> None:
        wk = self.workers[i]
        trajs = [sample(self.w, self.rng) for _ in range(self.p.group_size)]
        g = _Group(next(self.gids), i, wk.version, trajs, len(trajs), sum(tr.trained_tokens for tr in trajs))
        self.groups[g.gid] = g
        wk.groups.add(g.gid)
        for k in range(len(trajs)):
            self.start_turn(g, k, 0)

    def start_turn(self, g: _Group, k: int, turn: int) -> None:
        wk = self.workers[g.worker]
        seq = next(self.seqs)
        self.traj_of[seq] = (g.gid, k, turn)
        prefill, gen = g.trajectories[k].turns[turn]
        wk.engine.add(self.now, seq, gen, prefill)
        self.engine_changed(g.worker)

    def engine_changed(self, i: int) -> None:
        wk = self.workers[i]
        wk.epoch += 1
        when = wk.engine.next_finish()
        if when != float("inf"):
            self.at(when, "engine", i, wk.epoch)

    def engine(self, i: int, epoch: int) -> None:
        wk = self.workers[i]
        if epoch != wk.epoch:
            return
        for seq in wk.engine.pop_finished(self.now):
            gid, k, turn = self.traj_of.pop(seq)
            g = self.groups[gid]
            if turn + 1 < len(g.trajectories[k].turns):
                self.at(self.now + self.t.search_s, "searched", gid, k, turn + 1)
            else:
                g.left -= 1
                if g.left == 0:
                    self.at(self.now + self.t.group_s, "published", gid)
        self.engine_changed(i)

    def searched(self, gid: int, k: int, turn: int) -> None:
        self.start_turn(self.groups[gid], k, turn)

    def published(self, gid: int) -> None:
        g = self.groups.pop(gid)
        wk = self.workers[g.worker]
        wk.groups.discard(gid)
        self.queue.append(g)
        self.admit(g.worker)
        self.learn()

    # ------------------------------------------------------------------ learner

    def learn(self) -> None:
        if self.learner_busy or len(self.result.step_end_s) >= self.steps:
            return
        dropped = 0
        while self.queue and len(self.kept) < self.p.groups_per_step:
            g = self.queue.popleft()
            if self.version - g.version > self.p.max_staleness:
                dropped += 1
            else:
                self.kept.append(g)
        if dropped:
            self.result.dropped += dropped
            self.publish(dropped)
        if len(self.kept) < self.p.groups_per_step:
            return
        step, self.kept = self.kept, []
        self.result.staleness += [self.version - g.version for g in step]
        busy = self.t.train_s(sum(g.tokens for g in step)) + self.t.overhead_s + self.t.publish_s
        self.learner_busy = True
        self.learner_busy_s += busy
        self.at(self.now + busy, "stepped")

    def stepped(self) -> None:
        self.learner_busy = False
        self.version += 1
        self.announced = self.version
        self.result.step_end_s.append(self.now)
        self.publish(self.p.groups_per_step)
        self.learn()

    def run(self) -> Result:
        while self.events and len(self.result.step_end_s) < self.steps:
            when, _, kind, args = heapq.heappop(self.events)
            self.now = when
            getattr(self, kind)(*args)
        if len(self.result.step_end_s) < self.steps:
            raise RuntimeError(f"the pipeline stalled after {len(self.result.step_end_s)} steps")
        for wk in self.workers:
            wk.engine.advance(self.now)
        self.result.learner_busy_s = self.learner_busy_s
        self.result.rollout_busy_s = [wk.engine.busy_s + wk.reload_s for wk in self.workers]
        return self.result


def simulate(p: Pipeline, t: Times, w: Workload, steps: int, seed: int = 0) -> Result:
    """Run the pipeline until the learner has announced `steps` versions."""
    if steps < 1 or p.workers < 1 or p.groups_per_step < 1 or p.group_size < 1 or p.max_concurrent < 1:
        raise ValueError(f"steps, workers, groups, group size and max_concurrent must be >= 1: {p}, steps={steps}")
    return _Sim(p, t, w, steps, seed).run()
