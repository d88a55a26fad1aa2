"""The run's Redis names and stream entry ids: every service and tool names a stream, a consumer group or
an entry through these.

Keys live under `searchr1:{run}:` (`StreamKeys`): the tasks stream (read by the rollout workers' group
`TASKS_GROUP`), the trajectories stream (read by the learner's group `TRAJECTORIES_GROUP`), the dead
stream and the weights hash. An entry id is `"<ms>-<seq>"` (`parse_id`, `format_id`); redis-py answers
bytes, which `text` turns into the `str` every caller keeps.
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

    run: str
    """The run name (`[*.redis] run`): every key is prefixed `searchr1:{run}:`."""

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


def text(raw: bytes | str) -> str:
    """A Redis reply (an entry id, a group or consumer name) as `str`."""
    return raw.decode() if isinstance(raw, bytes) else raw


def parse_id(entry_id: str) -> tuple[int, int]:
    """`"<ms>-<seq>"` → (ms, seq)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def format_id(key: tuple[int, int]) -> str:
    """(ms, seq) → `"<ms>-<seq>"`."""
    return f"{key[0]}-{key[1]}"
