"""The dead stream is bounded in bytes, against a real redis-server: a 1 MiB entry that does not parse is
buried with its size and digest, not its payload; a small one keeps its payload (it can be redriven)."""

from __future__ import annotations

import hashlib

from searchr1.streams import DEAD_PAYLOAD_MAX_BYTES, PAYLOAD_FIELD, StreamKeys, read_dead, tasks_stream

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


async def test_an_entry_buried_past_max_deliveries_is_bounded_in_bytes_too(redis):
    """The re-delivery paths bury in their own script (`stream_scripts.BURY_IF`): a valid ~100 KB task
    delivered `max_deliveries` times keeps its size and sha1 in the reason, not its payload."""
    import asyncio

    from searchr1.core.schemas import Task, encode

    s = tasks_stream(redis, KEYS, visibility_timeout_ms=50, max_deliveries=1)
    await s.ensure_group()
    task = Task(task_id="big", question="q" * 16_000 + "?", golden_answers=["a" * 8_000] * 10)
    await s.publish(task)
    assert len(await s.read("w")) == 1  # its one delivery; the worker dies on it
    await asyncio.sleep(0.1)
    assert await s.reclaim("w2") == []
    [dead] = await read_dead(redis, KEYS.dead)
    payload = encode(task)
    assert len(payload) > DEAD_PAYLOAD_MAX_BYTES
    assert dead.payload == b"" and f"payload of {len(payload)} bytes not kept" in dead.reason
    assert hashlib.sha1(payload).hexdigest() in dead.reason and await s.pending() == 0
