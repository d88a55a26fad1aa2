"""The learner's output sections of `LearnerSettings` (`learner/settings.py` re-exports them): where and how
it publishes weights (`[learner.weights]`, with the `broadcast` transport's `[learner.weights.broadcast]`),
writes checkpoints (`[learner.checkpoint]`) and archives the trained groups (`[learner.archive]`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from searchr1.core.settings import Section


class BroadcastSettings(Section):
    """The `broadcast` weight transport (`learner/transport.py`): the learner is rank 0 of a process group
    whose other ranks are the rollout engines."""

    receivers: int = Field(default=1, ge=1, le=4096)
    """Rollout engines in the group (one per worker); a generation forms once all of them have joined."""
    host: str = "127.0.0.1"
    """Address the group's store listens on (only this one) and announces to the workers. Each version
    is signed with `weights.token` (HMAC-SHA256) and the workers reject one their token does not verify;
    the store itself takes no token: keep its port on the cluster's private network."""
    public_host: str | None = None
    """Host name the workers use to reach the store, if not `host`."""
    port: int = Field(default=29510, ge=0, le=65535)
    """The store's port (0 = any free port)."""
    backend: Literal["gloo", "nccl"] = "gloo"
    """gloo (CPU tensors) or NCCL (GPU tensors)."""
    timeout_s: float = Field(default=120.0, gt=0, le=3600)
    """How long a broadcast waits for every receiver; past it the group is re-formed and the version
    written as a snapshot for the late ones to catch up from."""
    bucket_mb: int = Field(default=64, ge=1, le=4096)
    """Bucket size: tensors are packed into buckets of about this many MiB per collective."""
    snapshot_every: int = Field(default=10, ge=1)
    """A recovery snapshot is written every this many versions (and after any failed broadcast)."""


class WeightsSettings(Section):
    transport: Literal["snapshot", "broadcast"] = "snapshot"
    """How versions reach the rollout engines: snapshot files (directory or HTTP), or tensors broadcast
    over a process group (`broadcast`), with snapshots kept for recovery."""
    broadcast: BroadcastSettings = Field(default_factory=BroadcastSettings)
    """The broadcast transport (used when `transport = "broadcast"`)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The dtype versions are published in, cast from the fp32 master weights: auto = the learner's compute
    dtype (`model.dtype`), which is the engine's `engine.dtype` in every shipped config. Publishing fp32 to
    a bf16 engine doubles the bytes and the engine rounds them itself."""
    dir: Path = Path("weights")
    """Where snapshots `v{version:08d}/` are written (a shared volume for dir-mode workers)."""
    keep: int = Field(default=3, ge=1)
    """Snapshots kept on disk (older ones are pruned)."""
    http: bool = False
    """Serve snapshots over HTTP and announce `http://public_host:port/weights/{version}`."""
    host: str = "127.0.0.1"
    """HTTP bind address."""
    port: int = Field(default=0, ge=0, le=65535)
    """HTTP port (0 = any free port)."""
    public_host: str | None = None
    """Host name workers use to reach the learner (default: `host`)."""
    token: str | None = None
    """Bearer token the snapshot server requires (workers send their `weights.token`). None: no auth."""


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
