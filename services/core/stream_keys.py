"""The run's Redis key names and consumer groups: every service and tool names a stream through these.

Keys live under `searchr1:{run}:` (`StreamKeys`): the tasks stream (read by the rollout workers' group
`TASKS_GROUP`), the trajectories stream (read by the learner's group `TRAJECTORIES_GROUP`), the dead
stream and the weights hash. `searchr1.core.streams` builds the typed streams on them and re-exports
these names.
"""

from __future__ import annotations

from dataclasses import dataclass

TASKS_GROUP = "rollout"
"""Consumer group of the tasks stream: the rollout workers (the learner's dispatcher only publishes)."""
TRAJECTORIES_GROUP = "learner"
"""Consumer group of the trajectories stream: the learner (rank 0)."""


@dataclass(frozen=True, slots=True)
class StreamKeys:
    """Redis key names of one run."""

    run: str = "default"

    def key(self, name: str) -> str:
        return f"searchr1:{self.run}:{name}"

    @property
    def tasks(self) -> str:
        return self.key("tasks")

    @property
    def trajectories(self) -> str:
        return self.key("trajectories")

    @property
    def dead(self) -> str:
        return self.key("dead")

    @property
    def weights(self) -> str:
        """Hash `latest` {version, uri, sha256, created_at}."""
        return self.key("weights")
