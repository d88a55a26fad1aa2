"""How a new policy version reaches the rollout engines, the learner's side (docs/architecture.md, "Weight
sync"): one `WeightTransport` interface, two implementations, chosen by `weights.transport`
(`build_transport`).

- `SnapshotTransport` (default): plan the version (`versions.VersionChain`: full, a delta against the
  version before, or both), write it (`WeightPublisher.write`, `write_delta`) and announce it (without
  Redis — `train --replay` — write it only). After a publication that failed, the next goes out full.
- `BroadcastTransport`: announce a `broadcast://` URI (the group's address, generation and the
  version), then send the tensors over the process group (`broadcast.py`) to every receiver
  engine; no file. A snapshot is still written every `snapshot_every` versions, and at once after a
  failed broadcast, and recorded as the catch-up point (`catchup.py`): a worker that missed a
  broadcast loads it, then joins the next generation. A failed broadcast (a receiver dead, late or slow
  beyond `timeout_s`) never stops training: the version still counts, the group is re-formed for the
  next one, formed from the receivers that join it (`broadcast.py`, "Membership"). A version goes out as
  the delta against the version before when `weights.delta` yields one (under `max_share` of the full
  bytes) and every receiver holds that version, else whole (`figures`: `broadcast_delta`,
  `broadcast_wire_bytes`).

The announcement's `sha256` for a broadcast URI is the digest of the publication's header (version,
tensor names, dtypes, shapes); the digest of the tensors themselves travels in-band after the last
bucket and every receiver checks it (and acknowledges it with the version it loaded).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from searchr1.core.schemas import WeightVersion
from searchr1.streams import Lease, RedisLink, StreamKeys
from searchr1.weightsync.announce import announce
from searchr1.weightsync.broadcast import Broadcaster, BroadcastFailed, WireDelta
from searchr1.weightsync.catchup import record_snapshot
from searchr1.weightsync.publish import WeightPublisher, drop_shared
from searchr1.weightsync.safetensors import safetensors_bytes
from searchr1.weightsync.settings import DeltaSettings, PublishSettings
from searchr1.weightsync.versions import VersionChain

log = logging.getLogger("searchr1.weightsync.transport")


class WeightTransport(Protocol):
    """Delivers and announces one version (called on rank 0 with the gathered weights)."""

    figures: dict[str, float]
    """The figures of the last publication (`versions.Plan.figures`: the share of published values that
    changed, the bytes written, ...)."""

    async def publish(self, version: int, model: Any, state: dict) -> WeightVersion | None:
        """Deliver and announce `version`; the announcement (None when nothing was announced)."""

    def close(self) -> None: ...


async def _call(link: RedisLink | None, fn, what: str):
    return await (link.call(fn, what) if link is not None else fn())


@dataclass
class SnapshotTransport:
    """A version on disk per publication — a full snapshot, a delta against the version before, or both
    (`versions.VersionChain`) — announced on Redis (`redis` None: written, not announced)."""

    publisher: WeightPublisher
    redis: Any
    keys: StreamKeys
    link: RedisLink | None = None
    chain: VersionChain = field(default_factory=lambda: VersionChain(DeltaSettings(enabled=False)))
    figures: dict[str, float] = field(default_factory=dict)

    async def publish(self, version: int, model: Any, state: dict) -> WeightVersion | None:
        t0 = time.perf_counter()
        named = drop_shared(model, state)
        plan = await asyncio.to_thread(self.chain.plan, version, named)
        try:
            written = []
            if plan.full:
                written.append(await asyncio.to_thread(self.publisher.write, version, model, named, plan.sums))
            if plan.delta is not None:
                written.append(await asyncio.to_thread(self.publisher.write_delta, version, plan.delta,
                                                       plan.delta_metadata))
            wv = None
            if self.redis is not None:
                wv = await self.publisher.announce(self.redis, self.keys, version, link=self.link,
                                                   delta=plan.delta is not None, full=plan.full)
        except BaseException:
            self.chain.forget()  # what was announced is unknown: the next version goes out full
            raise
        self.figures = {**plan.figures, "publish_seconds": time.perf_counter() - t0,
                        "published_bytes": float(sum(f.stat().st_size for d in written for f in d.iterdir()
                                                     if f.is_file()))}  # as written: headers and manifests too
        return wv

    def close(self) -> None:
        return None


@dataclass
class BroadcastTransport:
    publisher: WeightPublisher
    broadcaster: Broadcaster
    redis: Any
    keys: StreamKeys
    link: RedisLink | None = None
    snapshot_every: int = field(kw_only=True)
    """`weights.broadcast.snapshot_every`: every this many versions also a snapshot (the catch-up point)."""
    failures: int = 0
    lease: Lease | None = None
    """The learner's lease: the recovery-snapshot record is fenced by its token inside Redis."""
    chain: VersionChain = field(default_factory=lambda: VersionChain(DeltaSettings(enabled=False)))
    """Plans each version (the share of values changed; the delta the wire may carry)."""
    figures: dict[str, float] = field(default_factory=dict)
    figures_sums: dict[str, str] | None = None
    """The checksums of the version being published (written into its recovery snapshot)."""

    async def _snapshot(self, version: int, model: Any, state: dict) -> None:
        await asyncio.to_thread(self.publisher.write, version, model, state, self.figures_sums)
        digest = await asyncio.to_thread(self.publisher.digest, version)
        wv = WeightVersion(version=version, uri=self.publisher.uri(version), sha256=digest)
        await _call(self.link, lambda: record_snapshot(self.redis, self.keys, wv, fence=self.publisher.fence,
                                                       lease=self.lease), "record snapshot")
        await asyncio.to_thread(self.publisher.prune, version)

    async def publish(self, version: int, model: Any, state: dict) -> WeightVersion:
        plan = await asyncio.to_thread(self.chain.plan, version, drop_shared(model, state))
        self.figures, self.figures_sums = dict(plan.figures), plan.sums
        wire = None
        if plan.delta is not None and plan.base is not None:
            data = await asyncio.to_thread(safetensors_bytes, plan.delta, plan.delta_metadata)
            wire = WireDelta(plan.base, data)
        snapshot = version % self.snapshot_every == 0
        if snapshot:
            await self._snapshot(version, model, state)
        named = sorted(drop_shared(model, state).items())
        await asyncio.to_thread(self.broadcaster.refresh)  # a receiver back from a closed generation
        wv = WeightVersion(version=version, uri=self.broadcaster.uri(version),
                           sha256=self.broadcaster.header_digest(version, named))
        await _call(self.link, lambda: announce(self.redis, self.keys, wv, fence=self.publisher.fence),
                    "announce weights")
        try:
            await asyncio.to_thread(self.broadcaster.send, version, named, sums=plan.sums, delta=wire)
            self.figures.update(broadcast_delta=float(self.broadcaster.last_form == "delta"),
                                broadcast_wire_bytes=float(self.broadcaster.last_bytes),
                                broadcast_receivers=float(self.broadcaster.members),
                                published_bytes=float(self.broadcaster.last_bytes))  # what the workers got
        except BroadcastFailed as exc:
            self.failures += 1
            log.warning("broadcast of version %d failed (%s); group re-formed as generation %d", version, exc,
                        self.broadcaster.generation)
            if not snapshot:
                await self._snapshot(version, model, state)
        return wv

    def close(self) -> None:
        self.broadcaster.close()


def build_transport(weights: PublishSettings, publisher: WeightPublisher, redis: Any, keys: StreamKeys,
                    link: RedisLink | None, lease: Lease | None = None) -> WeightTransport:
    """The transport `weights.transport` names; without Redis (`train --replay`) snapshots written only.
    `lease` fences the broadcast transport's recovery-snapshot record inside Redis."""
    if weights.transport == "snapshot" or redis is None:
        return SnapshotTransport(publisher, redis, keys, link, chain=VersionChain(weights.delta))
    b = weights.broadcast
    bc = Broadcaster(b.host, b.port, b.receivers + 1, backend=b.backend, timeout_s=b.timeout_s,
                     bucket_bytes=b.bucket_mb << 20, key=(weights.token or "").encode(),  # signs each version
                     public_host=b.public_host, join_window_s=b.join_window_s)
    return BroadcastTransport(publisher, bc, redis, keys, link, snapshot_every=b.snapshot_every, lease=lease,
                              chain=VersionChain(weights.delta))
