"""The delivery audit of a run: what became of every task the dispatcher published.

Owns the counting, a pure function over records already read (`audit`), and its table; reading them from
Redis, the trajectory archive, the checkpoints and the logs is `audit_sources.py`'s, the command
`audit_commands.py`'s. The promise it checks (docs/reliability.md): with any one process killed at any
moment, every task is trained on exactly once, or accounted for as dropped (stale), dead-lettered or still
in flight — none lost, none trained twice.

The dispatched task ids are those of the tasks stream's entries together with the dispatcher's durable
record (`dispatch_log.py`): on a run that trims acked entries (`tasks.trim_acked_every` > 0) the stream
keeps only what some consumer group still needs, and the record keeps the rest. A trimmed task's fate
is then read where it was recorded: the archive (trained), the dead stream (dead-lettered), the learner's
log (dropped); only the unacked entries, which are never trimmed, come from the streams.

A task id (`{dataset id}@e{epoch}`) falls in the first of these that holds:

- **trained once** / **trained twice**: the kept archive rows (one per group) that hold it — two groups of
  one task in one step count as trained twice, like two steps that each trained it. A step
  archived again by a restarted learner (killed after archiving it, before checkpointing it) keeps only
  the rows of its latest part: the earlier copy's groups were never checkpointed, so they were not trained
  as far as the run is concerned (they are re-read and trained again, possibly in another step);
- **dead-lettered**: in the dead stream (a task or a group), with the reason recorded there, or in the
  dispatcher's record of dead-lettered tasks (`dead_tasks.py`; it outlives a Redis that lost the stream);
- **dropped**: a group for it was acked by the learner without being trained (the staleness policy or a
  sampling filter set it aside): an acked group in the trajectories stream, or the learner's log line
  (which gives the reason, and is all that is left of a trimmed group);
- **in flight**: a task or group entry not yet delivered, or delivered and not yet acked (the run ended
  with it queued, or a consumer died holding it and it awaits reclaiming);
- **lost**: none of the above — published, and then nothing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

EntryState = Literal["undelivered", "pending", "acked"]


@dataclass(frozen=True)
class StreamRecord:
    """One entry of the tasks or trajectories stream: its task id and where its consumer group has it."""

    entry_id: str
    task_id: str
    state: EntryState
    policy_version: int | None = None
    """Trajectories only: the version the group was sampled with."""


@dataclass(frozen=True)
class DeadRecord:
    """One dead-stream entry (`task_id` None when its payload cannot be decoded)."""

    source: str
    task_id: str | None
    reason: str


@dataclass(frozen=True)
class TrainedRow:
    """One archived group: the step that trained it, the archive part it is in, the task and worker."""

    step: int
    part: int
    task_id: str
    worker_id: str = ""
    policy_version: int = 0
    resumed: int = 0
    """Trajectories of the group whose tokens span more than one weight version (interrupted by a weight
    swap and resumed: `Trajectory.segments`)."""


@dataclass(frozen=True)
class CheckpointRecord:
    """The latest checkpoint's state."""

    step: int
    version: int
    consumed: frozenset[str]


@dataclass
class AuditReport:
    """What `audit` found; `ok` is the promise (nothing lost, nothing trained twice, archive and
    checkpoint agreeing)."""

    dispatched: int = 0
    task_entries: int = 0
    dispatch_records: int = 0
    """Lines of the dispatcher's durable record (0: a run without one, whose stream must be whole)."""
    trained_once: int = 0
    trained_twice: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)
    in_flight: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    trained_not_dispatched: list[str] = field(default_factory=list)
    superseded_steps: list[int] = field(default_factory=list)
    """Steps archived more than once (by a learner killed before checkpointing them)."""
    undecodable_dead: int = 0
    last_trained_step: int = 0
    checkpoint_step: int | None = None
    checkpoint_version: int | None = None
    checkpoint_mismatch: list[str] = field(default_factory=list)
    """Task ids in the kept archive up to the checkpoint's step but not in its consumed set, or the reverse."""
    learner_resumes: list[int] = field(default_factory=list)
    """The step each learner start resumed from, in order (from its log)."""
    announced_version: int | None = None
    worker_versions: dict[str, int] = field(default_factory=dict)
    resumed_trajectories: int = 0
    """Trained trajectories (kept archive rows) resumed across weight versions (partial rollouts)."""

    @property
    def ok(self) -> bool:
        return not (self.lost or self.trained_twice or self.checkpoint_mismatch or self.trained_not_dispatched)

    @property
    def workers_on_final_version(self) -> bool:
        final = self.announced_version if self.announced_version is not None else self.checkpoint_version
        return bool(self.worker_versions) and all(v == final for v in self.worker_versions.values())

    def as_json(self) -> dict:
        return {
            "dispatched": self.dispatched, "task_entries": self.task_entries,
            "dispatch_records": self.dispatch_records, "trained_once": self.trained_once,
            "trained_twice": len(self.trained_twice), "trained_twice_ids": self.trained_twice,
            "dropped": len(self.dropped), "dropped_reasons": dict(Counter(self.dropped.values())),
            "dead_lettered": len(self.dead), "dead_reasons": dict(Counter(self.dead.values())),
            "in_flight": len(self.in_flight), "lost": len(self.lost), "lost_ids": self.lost,
            "trained_not_dispatched": self.trained_not_dispatched, "superseded_steps": self.superseded_steps,
            "undecodable_dead": self.undecodable_dead, "last_trained_step": self.last_trained_step,
            "checkpoint_step": self.checkpoint_step, "checkpoint_version": self.checkpoint_version,
            "checkpoint_mismatch": self.checkpoint_mismatch, "learner_resumes": self.learner_resumes,
            "announced_version": self.announced_version, "worker_versions": self.worker_versions,
            "workers_on_final_version": self.workers_on_final_version,
            "resumed_trajectories": self.resumed_trajectories, "ok": self.ok,
        }


def kept_rows(rows: Sequence[TrainedRow]) -> tuple[list[TrainedRow], list[int]]:
    """The rows the run kept: for each step, those of the highest part holding that step; and the steps
    that had an earlier copy."""
    last_part: dict[int, int] = {}
    parts_of: dict[int, set[int]] = defaultdict(set)
    for r in rows:
        last_part[r.step] = max(r.part, last_part.get(r.step, r.part))
        parts_of[r.step].add(r.part)
    kept = [r for r in rows if r.part == last_part[r.step]]
    return kept, sorted(s for s, ps in parts_of.items() if len(ps) > 1)


def audit(tasks: Sequence[StreamRecord], groups: Sequence[StreamRecord], dead: Sequence[DeadRecord],
          trained: Sequence[TrainedRow], checkpoint: CheckpointRecord | None = None, *,
          drop_reasons: Mapping[str, str] | None = None, learner_resumes: Sequence[int] = (),
          announced_version: int | None = None, worker_versions: Mapping[str, int] | None = None,
          dispatch_log: Sequence[str] = ()) -> AuditReport:
    """Account for every dispatched task id (see the module docstring for the order of the categories);
    `dispatch_log` is the dispatcher's durable record of the task ids it published."""
    drop_reasons = drop_reasons or {}
    report = AuditReport(task_entries=len(tasks), dispatch_records=len(dispatch_log),
                         learner_resumes=list(learner_resumes),
                         announced_version=announced_version, worker_versions=dict(worker_versions or {}))
    dispatched = list(dict.fromkeys([*dispatch_log, *(t.task_id for t in tasks)]))
    report.dispatched = len(dispatched)
    kept, report.superseded_steps = kept_rows(trained)
    steps_of: Counter[str] = Counter(r.task_id for r in kept)  # groups trained per task id
    report.last_trained_step = max((r.step for r in kept), default=0)
    report.resumed_trajectories = sum(r.resumed for r in kept)
    dead_reason: dict[str, str] = {}
    for d in dead:
        if d.task_id is None:
            report.undecodable_dead += 1
        else:
            dead_reason.setdefault(d.task_id, d.reason)
    acked_groups: dict[str, StreamRecord] = {}
    queued: set[str] = set()
    for rec in (*tasks, *groups):
        if rec.state != "acked":
            queued.add(rec.task_id)
    for g in groups:
        if g.state == "acked":
            acked_groups.setdefault(g.task_id, g)
    for tid in dispatched:
        steps = steps_of.get(tid, 0)
        if steps == 1:
            report.trained_once += 1
        elif steps:
            report.trained_twice.append(tid)
        elif tid in dead_reason:
            report.dead[tid] = dead_reason[tid]
        elif tid in acked_groups or tid in drop_reasons:
            version = acked_groups[tid].policy_version if tid in acked_groups else None
            report.dropped[tid] = drop_reasons.get(tid) or f"acked untrained (sampled at version {version})"
        elif tid in queued:
            report.in_flight.append(tid)
        else:
            report.lost.append(tid)
    known = set(dispatched)
    report.trained_not_dispatched = sorted(t for t in steps_of if t not in known)
    if checkpoint is not None:
        report.checkpoint_step, report.checkpoint_version = checkpoint.step, checkpoint.version
        archived = {r.task_id for r in kept if r.step <= checkpoint.step}
        report.checkpoint_mismatch = sorted(archived ^ set(checkpoint.consumed))
    return report


def table_rows(report: AuditReport) -> list[tuple[str, str]]:
    """The audit table, one (what, figure) pair per line."""
    def reasons(by_task: dict[str, str]) -> str:
        counts = Counter(by_task.values())
        return "; ".join(f"{n}× {reason}" for reason, n in counts.most_common())

    final = report.announced_version if report.announced_version is not None else report.checkpoint_version
    rows = [
        ("tasks dispatched", f"{report.dispatched} ({report.task_entries} stream entries, "
                             f"{report.dispatch_records} recorded dispatches)"),
        ("trained exactly once", str(report.trained_once)),
        ("dropped (stale/filtered)", f"{len(report.dropped)}" + (f": {reasons(report.dropped)}" if report.dropped else "")),
        ("dead-lettered", f"{len(report.dead)}" + (f": {reasons(report.dead)}" if report.dead else "")),
        ("still in flight / pending", str(len(report.in_flight))),
        ("lost", str(len(report.lost)) + (f": {', '.join(report.lost[:10])}" if report.lost else "")),
        ("trained twice", str(len(report.trained_twice))
         + (f": {', '.join(report.trained_twice[:10])}" if report.trained_twice else "")),
        ("steps archived again after a restart", ", ".join(map(str, report.superseded_steps)) or "none"),
        ("last trained step / checkpoint", f"{report.last_trained_step} / "
                                           f"{'none' if report.checkpoint_step is None else report.checkpoint_step}"),
        ("archive vs checkpoint", "agree" if not report.checkpoint_mismatch
         else f"{len(report.checkpoint_mismatch)} task ids differ"),
        ("learner resumed from", ", ".join(f"step {s}" for s in report.learner_resumes) or "never restarted"),
        ("trajectories resumed across weight versions", str(report.resumed_trajectories)),
        ("final weight version", "unknown" if final is None else f"v{final}"),
    ]
    for worker, version in sorted(report.worker_versions.items()):
        rows.append((f"  {worker}", f"v{version}" + ("" if version == final else "  (behind)")))
    if report.undecodable_dead:
        rows.append(("dead letters with no readable task", str(report.undecodable_dead)))
    rows.append(("verdict", "OK: nothing lost, nothing trained twice" if report.ok else "FAILED"))
    return rows
