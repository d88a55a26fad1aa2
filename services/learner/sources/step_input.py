"""`StepInput`: the trajectories-stream entries one step read and what the filter decided for each
(`sources/stream.py`'s `filter_groups`): trained, replayed, too stale, at the wrong temperature, poison."""

from __future__ import annotations

from dataclasses import dataclass, field

from searchr1.core.schemas import TrajectoryGroup
from searchr1.learner.algo.staleness import Dropped
from searchr1.streams import Entry


@dataclass
class StepInput:
    """The stream entries of one step and what the filter decided for each."""

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
    poison: list[Dropped[Entry[TrajectoryGroup]]] = field(default_factory=list)
    """Schema-valid and untrainable (`algo/poison.py`: dead-lettered alone, with the reason)."""

    @property
    def skipped(self) -> int:
        """Entries read and not trained on."""
        return len(self.replays) + len(self.stale) + len(self.wrong_temperature) + len(self.poison)

    @property
    def untrained_tasks(self) -> int:
        """Entries whose task is not trained on: stale or at the wrong temperature. A replay is not one:
        its task was trained, and granted its replacement, when its first group was."""
        return len(self.stale) + len(self.wrong_temperature) + len(self.poison)

    def merge(self, more: StepInput) -> None:
        """Add another read's entries and decisions to this one."""
        self.entries += more.entries
        self.groups += more.groups
        self.replays += more.replays
        self.stale += more.stale
        self.wrong_temperature += more.wrong_temperature
        self.poison += more.poison

    def group_entry_ids(self) -> list[str]:
        """The stream entry id of each group to train on, in the order of `groups`."""
        by_value = {id(e.value): e.id for e in self.entries}
        return [by_value[id(g)] for g in self.groups]
