"""The entries a consumer holds: read and not yet acked, dead-lettered or given up (`Held[T]`).

Each entry is held from the read on (`hold`) until its work is done and acked, or it is left for
redelivery (`drop`). While held it is heartbeaten (`TypedStream.heartbeat`, which resets the idle time
of each entry still this consumer's and never takes back one another consumer reclaimed): `beat` once
(the learner, before each read), or `keep_beating` every `every_s` whatever the consumer's loop is doing
(a rollout worker: reading, loading or swapping weights, draining). So only a dead or hung consumer's
entries pass the visibility timeout, and `held` is what a consumer's reclaim and re-read leave out.
Entries a consumer abandons are handed back (`release`) for another consumer's next reclaim to take at
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import BaseModel
from redis.exceptions import RedisError

from searchr1.streams.redelivery import TypedStream

T = TypeVar("T", bound=BaseModel)

log = logging.getLogger("searchr1.streams")


@dataclass
class Held(Generic[T]):
    """The entry ids `consumer` holds on `stream`, and their heartbeat."""

    stream: TypedStream[T]
    consumer: str
    ids: set[str] = field(default_factory=set)

    def hold(self, ids: Iterable[str]) -> None:
        """Hold (and heartbeat) these entries from now on."""
        self.ids.update(ids)

    def drop(self, ids: Iterable[str]) -> None:
        """Stop holding these entries (acked, dead-lettered, or left unacked for redelivery)."""
        self.ids.difference_update(ids)

    async def beat(self) -> int:
        """Reset the idle time of the entries held, once; returns how many were still this consumer's."""
        if not self.ids:
            return 0
        return await self.stream.heartbeat(self.consumer, set(self.ids))

    async def keep_beating(self, every_s: float) -> None:
        """Every `every_s`, reset the idle time of the entries held; runs until cancelled. A failed
        heartbeat is logged and tried again at the next beat."""
        while True:
            await asyncio.sleep(every_s)
            if not self.ids:
                continue
            try:
                async with asyncio.timeout(max(every_s, 1.0)):
                    await self.beat()
            except (TimeoutError, RedisError, OSError) as exc:
                log.warning("could not heartbeat %d held entries of %s (trying again in %.1f s): %s",
                            len(self.ids), self.stream.key, every_s, exc)

    async def release(self, ids: Collection[str]) -> int:
        """Hand back abandoned entries for any consumer's next reclaim to take at once; returns how many
        (0 when Redis does not answer within 2 s: they wait out the visibility timeout instead)."""
        with contextlib.suppress(TimeoutError, RedisError, OSError):
            async with asyncio.timeout(2.0):
                return await self.stream.release(self.consumer, ids)
        return 0
