"""What the learner loop consumes: a `GroupSource` hands it one step's groups at a time.

The loop (`service.Learner`) calls a source's public stages only, in this order per step:
`next_step` → (train, archive, checkpoint) → `commit` → `ack` → (publish weights) → `grant`, and
`finished` between steps; the dispatcher reads `lag` for its backpressure. A source owns everything about where groups come from: reading, filtering,
setting aside, dead-lettering, and what an ack means. Two sources exist: the trajectories stream
(`stream.StreamSource`) and a trajectory archive (`archive.ArchiveSource`, for `train --replay`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from searchr1.core.schemas import TrajectoryGroup
from searchr1.learner.train.checkpoint import TrainState


@dataclass
class StepGroups:
    """One step's groups as a source hands them to the loop."""

    groups: list[TrajectoryGroup] = field(default_factory=list)
    """The groups to train on (empty: a read held only groups set aside; no step)."""
    entry_ids: list[str] = field(default_factory=list)
    """Each group's stream entry id, in the order of `groups` ("" where there is none: an archive)."""
    figures: dict[str, float] = field(default_factory=dict)
    """The source's filter counts for this step (DAPO's), logged with the step's figures."""


class GroupSource(Protocol):
    """Where the learner loop gets each step's groups."""

    async def start(self) -> None:
        """Prepare to read (create consumer groups, open files)."""

    async def next_step(self, stop: asyncio.Event, state: TrainState) -> StepGroups | None:
        """The next step's groups, given the loop's state (version, task ids already trained on). None
        when `stop` was set before a full step (no partial step on shutdown) or nothing is left."""

    def commit(self, entry_ids: Sequence[str]) -> None:
        """The step that trained these entries is done: ack them with the next `ack`."""

    async def ack(self, checkpointed: bool = True) -> None:
        """Ack every set-aside entry and, when `checkpointed` (right after a checkpoint), every committed
        one."""

    async def reject(self, entry_id: str, reason: str) -> None:
        """The loop refuses to train the group of `entry_id` (its worker is out of sync): set it aside for
        good, with the reason."""

    def grant(self, trained: int, version: int) -> None:
        """`trained` groups were trained on and `version` is announced: let the tasks that replace them
        be published."""

    async def finished(self) -> bool:
        """True when the source holds no more groups and never will."""

    async def lag(self) -> int:
        """Groups published for this source and not yet read: the dispatcher's backpressure."""
