"""Releasing held stream entries: a consumer that stops without finishing some entries hands them back, so
another consumer's next reclaim takes them at once instead of after the visibility timeout.

One Lua script: for each id still pending for this consumer (XPENDING with the consumer filter), XCLAIM it
to the same consumer with an idle time past the visibility timeout and JUSTID (the delivery count stays
as it is). An entry another consumer has reclaimed meanwhile is left alone: the check and the claim are
one atomic step inside Redis.
"""

from __future__ import annotations

from collections.abc import Collection

from redis import asyncio as aioredis

RELEASE_SCRIPT = """
local n = 0
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #p == 1 then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
    n = n + 1
  end
end
return n
"""
"""ARGV = group, consumer, idle ms, ids."""


async def release_pending(redis: aioredis.Redis, key: str, group: str, consumer: str, ids: Collection[str],
                          visibility_timeout_ms: int) -> int:
    """Release those of `ids` still pending for `consumer` in `group` of stream `key`; returns how many."""
    if not ids:
        return 0
    released = await redis.eval(RELEASE_SCRIPT, 1, key, group, consumer, str(visibility_timeout_ms + 1), *sorted(ids))
    return int(released)
