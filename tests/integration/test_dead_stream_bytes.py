"""The dead stream is bounded in bytes, against a real redis-server: a 1 MiB entry that does not parse is
buried with its size and digest, not its payload; a small one keeps its payload (it can be redriven)."""

from __future__ import annotations

import hashlib

from searchr1.core.dead_letters import DEAD_PAYLOAD_MAX_BYTES
from searchr1.core.streams import PAYLOAD_FIELD, StreamKeys, read_dead, tasks_stream

KEYS = StreamKeys("deadbytes")


async def test_a_large_refused_entry_is_buried_without_its_payload(redis):
    s = tasks_stream(redis, KEYS)
    await s.ensure_group()
    big = b"\xff" * (1 << 20)  # not msgpack of a Task: refused on read
    await redis.xadd(KEYS.tasks, {PAYLOAD_FIELD: big})
    await redis.xadd(KEYS.tasks, {PAYLOAD_FIELD: b"\xff" * 100})
    assert await s.read("w", count=10) == []
    dead = await read_dead(redis, KEYS.dead)
    assert len(dead) == 2
    assert dead[0].payload == b"" and f"payload of {1 << 20} bytes not kept" in dead[0].reason
    assert hashlib.sha256(big).hexdigest() in dead[0].reason
    assert dead[1].payload == b"\xff" * 100
    assert await redis.memory_usage(KEYS.dead) < 4 * DEAD_PAYLOAD_MAX_BYTES
