"""The rollout side of the `broadcast` weight transport (docs/architecture.md, "Weight sync"): an
announcement whose URI is `broadcast://…` is received into the vLLM engine over the learner's process
group (`broadcast_ext.receive_broadcast`); the digest is acknowledged in Redis with the version. When the
receive fails (the learner timed out on another receiver, this worker joined a full group, a digest
mismatch), the worker catches up from the learner's latest recovery snapshot (`searchr1.core.catchup`)
and joins the group's next generation at the next announcement. `WeightLoader.load_broadcast`
(`weights.py`) calls it and records the version it returns.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from redis import asyncio as aioredis

from searchr1.core.catchup import acknowledge, latest_snapshot_fenced
from searchr1.core.schemas import WeightVersion
from searchr1.core.snapshot_fetch import SnapshotError, fetch_snapshot
from searchr1.core.streams import StreamKeys
from searchr1.rollout.broadcast_ext import receive_broadcast
from searchr1.rollout.engine import Generator

log = logging.getLogger("searchr1.rollout.weights")


def is_broadcast(uri: str) -> bool:
    return uri.startswith("broadcast://")


async def receive_or_catch_up(generator: Generator, redis: aioredis.Redis, keys: StreamKeys,
                              announced: WeightVersion, *, download_dir: Path, token: str | None,
                              fence: int) -> tuple[int, str] | None:
    """Receive `announced` over the group into `generator`, or else load the latest recovery snapshot (a
    failed receive may have loaded part of the update), refusing one recorded with an older fencing token
    than `fence` (the newest the worker has seen). Acknowledges what it loaded; returns (the version now
    running, `broadcast` or the snapshot's URI), or None when neither worked."""
    worker = f"{socket.gethostname()}:{os.getpid()}"
    try:
        digest = await receive_broadcast(generator, announced.uri)
    except Exception as exc:  # noqa: BLE001 - any failure of the group: catch up from the snapshot instead
        log.warning("broadcast of version %d not received (%s); catching up from the latest snapshot",
                    announced.version, exc)
        # the engine may hold part of the failed update: reload the latest snapshot even when it is not
        # newer than the version loaded before (the version tag then follows the weights back)
        snap, snap_fence = await latest_snapshot_fenced(redis, keys)
        if snap is None:
            log.error("no recovery snapshot recorded: the engine may hold part of version %d", announced.version)
            return None
        if snap_fence < fence:
            log.error("refusing recovery snapshot %d: recorded with fencing token %d, older than the %d this "
                      "worker has seen (a stale learner's)", snap.version, snap_fence, fence)
            return None
        try:
            path = await fetch_snapshot(snap, download_dir, token=token)
            await generator.reload(str(path), snap.sha256)
        except SnapshotError as err:
            log.error("recovery snapshot %d unusable: %s", snap.version, err)
            return None
        await acknowledge(redis, keys, worker, snap.version, snap.sha256)
        return snap.version, snap.uri
    await acknowledge(redis, keys, worker, announced.version, digest)
    return announced.version, "broadcast"
