"""What the learner's read and filter stages hand to the train stage: `StepInput`.

Owns the bookkeeping of one step's stream entries (kept, replayed, stale, dead-lettered) and which entry
each trained group came from; not the reading or the filtering rules (`service.py`, `staleness.py`,
`sampling.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from searchr1.core.schemas import TrajectoryGroup
from searchr1.core.streams import Entry
from searchr1.learner.algo.staleness import Dropped


@dataclass
class StepInput:
    """What the read and filter stages produce for one step."""

    entries: list[Entry[TrajectoryGroup]] = field(default_factory=list)
    """Every entry read (reclaimed first)."""
    groups: list[TrajectoryGroup] = field(default_factory=list)
    """The groups to train on."""
    replays: list[Entry[TrajectoryGroup]] = field(default_factory=list)
    """Task ids already trained on (acked, not trained)."""
    stale: list[Dropped[Entry[TrajectoryGroup]]] = field(default_factory=list)
    """Too stale under the staleness policy (acked, not trained)."""
    wrong_temperature: list[Dropped[Entry[TrajectoryGroup]]] = field(default_factory=list)
    """Sampled at another temperature than the learner's (dead-lettered)."""

    @property
    def skipped(self) -> int:
        """Entries read and not trained on."""
        return len(self.replays) + len(self.stale) + len(self.wrong_temperature)

    @property
    def untrained_tasks(self) -> int:
        """Entries whose task is not trained on: stale or at the wrong temperature. A replay is not one:
        its task was trained, and granted its replacement, when its first group was."""
        return len(self.stale) + len(self.wrong_temperature)

    def merge(self, more: StepInput) -> None:
        """Add another read's entries and decisions to this one."""
        self.entries += more.entries
        self.groups += more.groups
        self.replays += more.replays
        self.stale += more.stale
        self.wrong_temperature += more.wrong_temperature

    def group_entry_ids(self) -> list[str]:
        """The stream entry id of each group to train on, in the order of `groups`."""
        by_value = {id(e.value): e.id for e in self.entries}
        return [by_value[id(g)] for g in self.groups]
