"""The tasks a rollout worker holds: read and not yet acked or given up (`worker.py` runs them).

Each task is held from the read on (`hold`) until its group is published and acked, or it is left for
redelivery (`drop`). While held it is heartbeaten: every `every_s` (a quarter of the visibility timeout)
`keep_beating` resets the idle time of every held task (`TypedStream.heartbeat`, which never takes back
one another worker reclaimed), whatever the worker's loop is doing — reading, loading or swapping
weights, draining — so only a dead or hung worker's tasks pass the visibility timeout. Tasks a drain
abandons are handed back (`release`) for another worker's next reclaim to take at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from searchr1.core.schemas import Task
from searchr1.core.streams import TypedStream

log = logging.getLogger("searchr1.rollout.worker")


@dataclass
class HeldTasks:
    """The stream entry ids `consumer` holds on `tasks`, and their heartbeat."""

    tasks: TypedStream[Task]
    consumer: str
    ids: set[str] = field(default_factory=set)

    def hold(self, ids: Iterable[str]) -> None:
        """Hold (and heartbeat) these entries from now on."""
        self.ids.update(ids)

    def drop(self, ids: Iterable[str]) -> None:
        """Stop holding these entries (acked, or left unacked for redelivery)."""
        self.ids.difference_update(ids)

    async def keep_beating(self, every_s: float) -> None:
        """Every `every_s`, reset the idle time of the entries held; runs until cancelled. A failed
        heartbeat is logged and tried again at the next beat."""
        while True:
            await asyncio.sleep(every_s)
            if not self.ids:
                continue
            try:
                async with asyncio.timeout(max(every_s, 1.0)):
                    await self.tasks.heartbeat(self.consumer, set(self.ids))
            except (TimeoutError, RedisError, OSError) as exc:
                log.warning("could not heartbeat %d held task(s) (trying again in %.1f s): %s", len(self.ids),
                            every_s, exc)

    async def release(self, ids: Collection[str]) -> int:
        """Hand back abandoned entries for any worker's next reclaim to take at once; returns how many
        (0 when Redis does not answer within 2 s: they wait out the visibility timeout instead)."""
        with contextlib.suppress(TimeoutError, RedisError, OSError):
            async with asyncio.timeout(2.0):
                return await self.tasks.release(self.consumer, ids)
        return 0
