"""The learner's output sections of `LearnerSettings` (`learner/settings.py` re-exports them): where it
writes checkpoints (`[learner.checkpoint]`) and archives the trained groups (`[learner.archive]`). Where
and how it publishes weights (`[learner.weights]`) is weight sync's section (`searchr1.weightsync.
PublishSettings`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from searchr1.core.settings import Section


class CheckpointSettings(Section):
    dir: Path = Path("checkpoints")
    """Checkpoint directory (`step{n:08d}/`)."""
    keep: int = Field(default=2, ge=1)
    """Checkpoints kept."""
    every: int = Field(default=1, ge=1)
    """Checkpoint every this many steps; groups are acked only once checkpointed, so keep
    `visibility_timeout_ms` longer than `every` steps."""


class ArchiveSettings(Section):
    enabled: bool = True
    """Archive every trained group to Parquet (`tools/archive.py`): one row per trajectory with its tokens, masks,
    log-probs and rewards, durable before the group is acked."""
    every_steps: int = Field(default=10, ge=1, le=10_000)
    """Steps per part file; the open part is rewritten at each step, so its cost grows with this."""
    dir: Path | None = None
    """Directory of the part files (`part-{seq:06d}.parquet`); None = `archive/` beside `checkpoint.dir`
    (`LearnerSettings.archive_dir`)."""
    replay_from: Path | None = None
    """Train from this archive instead of the trajectories stream (no Redis, no rollout): its groups, step by
    step in order. Replay writes no archive."""
