"""The rollout side of weight sync (docs/architecture.md, "Weight sync"): look up the latest announced `WeightVersion`, fetch
and verify its snapshot (sha256, via `searchr1.core.snapshot_fetch.fetch_snapshot`), and reload the engine in
place. The worker calls `maybe_update` only when no trajectory is in flight, so every group is generated
by exactly one version.

The learner may ask one worker to re-sync (`core.weights.request_resync`: its groups showed a
train–inference mismatch far beyond its peers'); the worker takes the request before its next tasks and
reloads the announced weights even at an unchanged version (`resync`).

A snapshot that fails verification is skipped (and logged); the worker keeps the weights it has and
tries again when a newer version is announced. So is an announcement the worker must not trust: one
made with an older fencing token (`core/lease.py`) than the newest this worker has seen (a stale
learner's, or one restored from old Redis data), and one the learner never published (no matching
record in `weights:published`, which `core.weights.announce` writes with every announcement). With a
`RedisLink`, reading the announcement waits for Redis through an outage.

Nothing here blocks the event loop: verification and downloads run their disk work in threads
(`fetch_snapshot`), and both engines reload off the loop (vLLM in its engine-core process, the
transformers fallback in a thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from redis import asyncio as aioredis

from searchr1.core.faults import fault_fires
from searchr1.core.metrics import in_stage
from searchr1.core.redis_link import RedisLink
from searchr1.core.resync import take_resync
from searchr1.core.schemas import WeightVersion
from searchr1.core.snapshot_fetch import SnapshotError, fetch_snapshot, prune_copies
from searchr1.core.streams import StreamKeys
from searchr1.core.weights import is_published, latest_fenced
from searchr1.rollout.broadcast_loader import is_broadcast, receive_or_catch_up
from searchr1.rollout.engine import Generator
from searchr1.rollout.metrics import RolloutMetrics

log = logging.getLogger("searchr1.rollout.weights")


@dataclass
class WeightLoader:
    """Keeps the engine on the newest announced policy version."""

    redis: aioredis.Redis
    keys: StreamKeys
    generator: Generator
    metrics: RolloutMetrics
    download_dir: Path
    version: int = 0
    token: str | None = None
    link: RedisLink | None = None
    _failed_version: int = -1
    _sha256: str | None = None
    """Digest of the snapshot loaded (None: the weights the engine started with)."""
    _failed_sha256: str | None = None
    fence: int = 0
    """The newest fencing token seen on an announcement: one made with an older token is refused."""

    async def _redis(self, call, what: str):
        return await (self.link.call(call, what) if self.link is not None else call())

    async def newer(self) -> WeightVersion | None:
        """The announced version if it is not the one loaded (and not one that already failed or was
        refused): a newer one, or an older one the learner published before (`searchr1 weights rollback`;
        announcements only go back that way), or the same version written again with other bytes; and
        only if it carries no older fencing token than seen before and the learner published it."""
        announced, fence = await self._redis(lambda: latest_fenced(self.redis, self.keys), "weights")
        newest_seen, self.fence = self.fence, max(self.fence, fence)
        if announced is None or announced.sha256 == self._failed_sha256:
            return None
        if announced.version == self.version and self._sha256 in (None, announced.sha256):
            return None
        if fence < newest_seen:
            return self._refuse(announced, f"announced with fencing token {fence}, older than the {newest_seen} "
                                           f"this worker has seen (a stale learner's announcement)")
        if not await self._redis(lambda: is_published(self.redis, self.keys, announced), "weights"):
            return self._refuse(announced, "the learner never published it (no matching record in "
                                           "weights:published)")
        return announced

    def _refuse(self, announced: WeightVersion, why: str) -> None:
        """Never load `announced` (logged once: its digest is remembered as failed)."""
        self._failed_version, self._failed_sha256 = announced.version, announced.sha256
        self.metrics.weight_refusals.inc()
        log.error("refusing weight version %d (%s): %s", announced.version, announced.uri, why)
        return None

    @in_stage("weight_reload", lambda self: self.metrics.stages)
    async def load(self, announced: WeightVersion) -> bool:
        """Fetch, verify and reload `announced`; True when the engine now runs it."""
        t0 = time.perf_counter()
        if is_broadcast(announced.uri):
            loaded = await self.load_broadcast(announced)
            if loaded is None:
                self._failed_version = announced.version
                return False
            self.metrics.weight_version.set(self.version)
            self.metrics.weight_reload_seconds.observe(time.perf_counter() - t0)
            log.info("loaded weight version %d from %s", self.version, loaded)
            return True
        try:
            path = await fetch_snapshot(announced, self.download_dir, token=self.token)
            if not fault_fires("rollout.skip_reload"):  # test hook (core/faults.py): a reload that did nothing
                await self.generator.reload(str(path))
        except SnapshotError as exc:
            self._failed_version, self._failed_sha256 = announced.version, announced.sha256
            log.error("skipping weight version %d: %s", announced.version, exc)
            return False
        elapsed = time.perf_counter() - t0
        self.version, self._sha256 = announced.version, announced.sha256
        await asyncio.to_thread(prune_copies, self.download_dir, announced.version)
        self.metrics.weight_version.set(self.version)
        self.metrics.weight_reload_seconds.observe(elapsed)
        log.info("loaded weight version %d from %s in %.3f s", announced.version, announced.uri, elapsed)
        return True

    async def take_resync(self, worker_id: str) -> str | None:
        """The learner's pending request that this worker re-sync (taken as read), or None."""
        return await self._redis(lambda: take_resync(self.redis, self.keys, worker_id), "resync")

    async def resync(self) -> bool:
        """Reload the announced weights even if their version is the one loaded (the learner found this
        worker's groups out of sync with them: a reload that failed silently, wrong bytes, another dtype)."""
        announced, _ = await self._redis(lambda: latest_fenced(self.redis, self.keys), "weights")
        if announced is None:
            return False
        self._failed_sha256 = None
        return await self.load(announced)

    async def load_broadcast(self, announced: WeightVersion) -> str | None:
        """Receive `announced` over the broadcast group, or catch up from the latest recovery snapshot
        (`broadcast_loader.py`); returns what now runs (`broadcast` or the snapshot's URI), or None."""
        got = await receive_or_catch_up(self.generator, self.redis, self.keys, announced,
                                        download_dir=self.download_dir, token=self.token, fence=self.fence)
        if got is None:
            return None
        self.version, loaded = got
        return loaded

    async def maybe_update(self) -> bool:
        """Load the newest version if there is one; True when the version changed."""
        announced = await self.newer()
        return False if announced is None else await self.load(announced)
