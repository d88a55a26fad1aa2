"""The tasks the rollout workers dead-lettered, as the dispatcher learns of them: read back from the run's
dead stream (`searchr1.streams.Burials`) and recorded on disk, one `task_id<TAB>reason` a line, in
`{log_dir}/{run}.dead-tasks` (`RUN_DIR/learner/` under `searchr1 up`).

A task is dead-lettered after `max_deliveries` deliveries without an ack (a question that crashes the
engine, a reward service down for minutes) or when no worker can decode it. The dispatcher needs to know
twice: at once, to publish a replacement (a lockstep step counting on that task's group would otherwise
wait for it for good), and after a restart, to skip it when it publishes again from the checkpoint's
position (a poison task would otherwise be dealt out, and buried, once more per restart). The record is
on disk because Redis can lose the dead stream; a line is flushed to the operating system at once. The
delivery audit reads it too: a task recorded here was dead-lettered even when the dead stream no longer
holds it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from searchr1.core.schemas import SchemaError, Task, decode
from searchr1.streams import Burials, DeadLetter, TypedStream

log = logging.getLogger("searchr1.learner")


def dead_tasks_path(log_dir: Path, run: str) -> Path:
    """Where the learner of run `run` records the tasks dead-lettered."""
    return Path(log_dir) / f"{run}.dead-tasks"


def read_dead_tasks(path: Path) -> dict[str, str]:
    """task id → reason of every complete line of `path` (a missing file: none)."""
    if not Path(path).is_file():
        return {}
    lines = Path(path).read_text(encoding="utf-8", errors="replace").split("\n")[:-1]  # the last: unfinished
    out: dict[str, str] = {}
    for line in lines:
        tid, _, reason = line.partition("\t")
        if tid:
            out.setdefault(tid, reason)
    return out


@dataclass(frozen=True, slots=True)
class DeadTask:
    """One task dead-lettered on the tasks stream."""

    task_id: str | None
    """None when neither the dead letter nor the stream holds its payload any more."""
    entry_id: str
    """Its entry on the tasks stream."""
    reason: str


class DeadTasks:
    """The dead-lettered tasks of a run: `known` (recorded or found at `start`), and those buried since
    (`poll`), each recorded before it is returned."""

    def __init__(self, path: Path, burials: Burials, tasks: TypedStream[Task]) -> None:
        self.path = Path(path)
        self.burials = burials
        self.tasks = tasks
        self.known: set[str] = set()
        """Task ids dead-lettered so far (the record and the dead stream): the dispatcher skips them."""

    async def start(self) -> set[str]:
        """Read the record and the whole dead stream; record what the stream holds and the file does not.
        Returns `known`."""
        self.known = set(await asyncio.to_thread(lambda: read_dead_tasks(self.path)))
        found = await self.poll()
        if self.known:
            log.info("%d task(s) dead-lettered so far (%d found in the dead stream): they are not published again",
                     len(self.known), len({d.task_id for d in found if d.task_id is not None}))
        return self.known

    async def poll(self) -> list[DeadTask]:
        """The tasks dead-lettered since the last call (the first call: all the dead stream holds), one per
        dead letter (a task published twice may be buried twice); the ids not yet known are recorded and
        added to `known`."""
        dead = [await self._task_of(d) for d in await self.burials.poll()]
        new = {d.task_id: d for d in dead if d.task_id is not None and d.task_id not in self.known}
        lines = [f"{tid}\t{' '.join(d.reason.split())}\n" for tid, d in new.items()]
        if lines:
            await asyncio.to_thread(self._append, lines)
        self.known.update(new)
        return dead

    def _append(self, lines: list[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(lines))
            f.flush()

    async def _task_of(self, d: DeadLetter) -> DeadTask:
        task: Task | None = None
        if d.payload:
            try:
                task = decode(Task, d.payload)
            except SchemaError:
                task = None
        if task is None:  # no payload kept (over the size bound, or it never decoded): the stream may hold it
            task = await self.tasks.get(d.source_id)
        return DeadTask(task.task_id if task is not None else None, d.source_id, d.reason)
