"""A trajectory archive as a `GroupSource`: `ArchiveSource` feeds `searchr1 train --replay`.

The archive's groups (`tools/archive.py`; a step archived twice is taken once, from its latest part) are
handed to the loop step by step in order, through the loop's own train → checkpoint → publish stages, so a
replayed run computes the same losses as a live one would on those groups. No Redis, no dispatcher, no
rollout: acks and grants are no-ops. A replay resumed from a checkpoint skips the archive steps whose task
ids the checkpoint already holds. Single process (no torchrun).

Search-R1 has no equivalent: its trainer samples and trains in one loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from searchr1.core.schemas import TrajectoryGroup
from searchr1.learner.sources.base import StepGroups
from searchr1.learner.tools.archive import groups_by_step, latest_copies, read
from searchr1.learner.train.checkpoint import TrainState

log = logging.getLogger("searchr1.learner")


class ArchiveSource:
    """The steps of one trajectory archive, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._steps: list[tuple[int, list[TrajectoryGroup]]] = []
        self._next = 0

    async def start(self) -> None:
        """Read the archive (its latest copy of every step)."""
        table = await asyncio.to_thread(lambda: latest_copies(read(self.path)))
        self._steps = await asyncio.to_thread(groups_by_step, table)
        log.info("replaying %d archived steps from %s", len(self._steps), self.path)

    async def next_step(self, stop: asyncio.Event, state: TrainState) -> StepGroups | None:
        """The next archived step not trained before (all its task ids in `state.consumed`); None when the
        archive is done or `stop` is set."""
        while self._next < len(self._steps) and not stop.is_set():
            archived_step, groups = self._steps[self._next]
            self._next += 1
            if all(g.task.task_id in state.consumed for g in groups):
                continue  # trained before this replay resumed
            log.info("replaying archived step %d as step %d", archived_step, state.step + 1)
            return StepGroups(groups, [""] * len(groups))
        return None

    def commit(self, entry_ids: Sequence[str]) -> None:
        """Nothing to ack in an archive."""

    async def ack(self, checkpointed: bool = True) -> None:
        """Nothing to ack in an archive."""

    async def reject(self, entry_id: str, reason: str) -> None:
        """An archived group the loop refused to train stays in the archive (logged by the loop)."""

    def grant(self, trained: int, version: int) -> None:
        """No dispatcher to grant."""

    async def finished(self) -> bool:
        return self._next >= len(self._steps)

    async def lag(self) -> int:
        """Nothing is published to an archive."""
        return 0
