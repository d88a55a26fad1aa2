"""Weight sync's settings sections: how the learner publishes (`PublishSettings`, the learner's
`[learner.weights]`, with the broadcast transport's `[learner.weights.broadcast]`) and how a rollout worker
loads (`LoadSettings`, the rollout's `[rollout.weights]`). The services' settings classes hold these
sections under those names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from searchr1.core.settings import Section


class BroadcastSettings(Section):
    """The `broadcast` weight transport (`transport.BroadcastTransport`): the learner is rank 0 of a process
    group whose other ranks are the rollout engines."""

    receivers: int = Field(default=1, ge=1, le=4096)
    """Rollout engines in the group (one per worker); a generation forms once all of them have joined,
    or with those that joined when its wait ends (`timeout_s` for the first, `join_window_s` after)."""
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
    """How long each collective of a broadcast waits (and the first generation for every receiver to join);
    past it the group is re-formed and the version written as a snapshot for the late ones to catch up from."""
    join_window_s: float = Field(default=10.0, gt=0, le=3600)
    """How long every generation after the first waits for the receivers to join before it forms with
    those that did (at most `timeout_s`): a receiver that stopped costs the next version this, not
    `timeout_s`. Receivers that join later catch up from a snapshot and join the next generation."""
    bucket_mb: int = Field(default=64, ge=1, le=4096)
    """Bucket size: tensors are packed into buckets of about this many MiB per collective."""
    snapshot_every: int = Field(default=10, ge=1)
    """A recovery snapshot is written every this many versions (and after any failed broadcast)."""


class DeltaSettings(Section):
    """Versions published as deltas against the version before (`versions.VersionChain`,
    `[learner.weights.delta]`): on disk for the snapshot transport; on the wire for the broadcast transport
    when every receiver holds the version before (`full_every` does not apply there: its catch-up point
    is `broadcast.snapshot_every`)."""

    enabled: bool = True
    """Publish a version as the values that changed since the previous one (positions and new values,
    zstd-compressed, with a checksum of every resulting tensor) when that is smaller than `max_share` of
    the full version; False: every version full."""
    full_every: int = Field(default=10, ge=1, le=100_000)
    """Every this many versions a full snapshot is written too (the delta beside it): a worker that is new
    or more than one version behind loads the newest full and then at most `full_every` − 1 deltas."""
    max_share: float = Field(default=0.5, gt=0, le=1)
    """A delta larger than this share of the full version's bytes is not written: the version goes out
    full (an fp32 publication, where nearly every value changes, always does)."""
    codec: Literal["zstd", "raw"] = "zstd"
    """How a delta's positions and values are stored: zstd level 1, or raw bytes."""


class PublishSettings(Section):
    """Where and how the learner publishes weight versions (`[learner.weights]`)."""

    transport: Literal["snapshot", "broadcast"] = "snapshot"
    """How versions reach the rollout engines: snapshot files (directory or HTTP), or tensors broadcast
    over a process group (`broadcast`), with snapshots kept for recovery."""
    broadcast: BroadcastSettings = Field(default_factory=BroadcastSettings)
    """The broadcast transport (used when `transport = "broadcast"`)."""
    delta: DeltaSettings = Field(default_factory=DeltaSettings)
    """Deltas between versions (both transports)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The dtype versions are published in, cast from the fp32 master weights: auto = the learner's compute
    dtype (`model.dtype`), which is the engine's `engine.dtype` in every shipped config. Publishing fp32 to
    a bf16 engine doubles the bytes and the engine rounds them itself."""
    dir: Path = Path("weights")
    """Where snapshots `v{version:08d}/` are written (a shared volume for dir-mode workers)."""
    keep: int = Field(default=3, ge=1)
    """Full snapshots kept on disk, each with the deltas after it (older fulls and the deltas up to the
    oldest kept full are pruned)."""
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


class LoadSettings(Section):
    """How a rollout worker follows the announced weight versions (`[rollout.weights]`)."""

    poll_interval_s: float = Field(default=2.0, gt=0)
    """How often the latest announced weight version is checked."""
    download_dir: str = ".searchr1/rollout-weights"
    """Where the worker keeps its local copies of the snapshots it loads (downloaded over HTTP, or
    hard-linked from a shared volume and verified there), relative to the working directory; copies older
    than the loaded version are deleted. `searchr1 up` gives each worker its own under the run directory."""
    token: str | None = None
    """Bearer token for downloading snapshots."""
    partial_rollouts: bool = False
    """True: a new weight version interrupts the turns in flight at their next token, loads, and resumes
    them from their prefix under the new weights (each token records the version that sampled it:
    `Trajectory.segments`), instead of letting every in-flight group finish first. Off for Search-R1
    parity runs (every group sampled by one version)."""
