"""Re-sync requests from the learner to one rollout worker: a Redis key per worker, set when the learner's
desync screen found the worker's groups out of sync with the announced weights (`learner/algo/desync.py`),
taken (read and deleted) by the worker before its next tasks, which then reloads the announced weights
(`rollout/weights.WeightLoader.resync`).
"""

from __future__ import annotations

from redis import asyncio as aioredis

from searchr1.core.streams import StreamKeys

RESYNC_TTL_S = 3600
"""How long a re-sync request waits for its worker (a worker gone for good leaves no key behind)."""


def resync_key(keys: StreamKeys, worker_id: str) -> str:
    """The key the learner sets to tell one worker to reload the announced weights (its groups showed a
    train–inference mismatch far beyond its peers': `learner/algo/desync.py`)."""
    return keys.key(f"resync:{worker_id}")


async def request_resync(redis: aioredis.Redis, keys: StreamKeys, worker_id: str, reason: str) -> None:
    """Ask `worker_id` to reload the announced weights before its next task (the reason is kept for the
    worker's log)."""
    await redis.set(resync_key(keys, worker_id), reason.encode(), ex=RESYNC_TTL_S)


async def take_resync(redis: aioredis.Redis, keys: StreamKeys, worker_id: str) -> str | None:
    """The pending re-sync request of `worker_id` (taken: deleted as it is read), or None."""
    raw = await redis.getdel(resync_key(keys, worker_id))
    return None if raw is None else raw.decode(errors="replace")
