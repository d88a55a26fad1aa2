"""Hostile stream entries against a real redis-server, beyond the malformed and poison cases of
test_streams.py: entries a fuzzer would write (random bytes, a valid envelope of the wrong schema version,
a valid envelope whose data breaks the model, a non-UTF-8 field name, a 1 MiB blob) each go to the dead
stream with a reason, and the consumer carries on with every good entry around them, in order."""

from __future__ import annotations

import random

import msgpack

from searchr1.core.schemas import SCHEMA_VERSION, Task, encode
from searchr1.streams import PAYLOAD_FIELD, StreamKeys, TypedStream, read_dead

KEYS = StreamKeys("bad-input")


def task(i: int) -> Task:
    return Task(task_id=f"t{i}", question=f"question {i}?", golden_answers=[str(i)])


def poisons() -> list[dict[bytes, bytes]]:
    rng = random.Random(7)
    envelope = lambda **kw: msgpack.packb({"v": SCHEMA_VERSION, "kind": "Task", "data": {}, **kw})  # noqa: E731
    return [
        {PAYLOAD_FIELD: bytes(rng.getrandbits(8) for _ in range(64))},
        {PAYLOAD_FIELD: envelope(v=SCHEMA_VERSION + 1)},
        {PAYLOAD_FIELD: envelope(data={"task_id": "", "question": 7, "golden_answers": "x"})},
        {PAYLOAD_FIELD: envelope(data={**task(0).model_dump(), "unexpected": True})},
        {b"\xff\xfe": encode(task(0))},
        {PAYLOAD_FIELD: b"\x00" * (1 << 20)},
        {PAYLOAD_FIELD: b""},
    ]


async def test_every_poison_is_buried_and_the_consumer_carries_on(redis):
    stream = TypedStream(redis, KEYS.tasks, Task, "rollout", dead_key=KEYS.dead, visibility_timeout_ms=200,
                         max_deliveries=3)
    await stream.ensure_group()
    bad = poisons()
    for i, fields in enumerate(bad):
        await stream.publish(task(i))
        await redis.xadd(KEYS.tasks, fields)
    await stream.publish(task(len(bad)))
    got = []
    for _ in range(10):
        entries = await stream.read("c1", count=3)
        got += entries
        if not entries and len(got) == len(bad) + 1:
            break
    assert [e.value.task_id for e in got] == [f"t{i}" for i in range(len(bad) + 1)]
    for entry in got:
        await stream.ack(entry.id)
    dead = await read_dead(redis, KEYS.dead)
    assert len(dead) == len(bad)
    assert all(d.reason and d.source == KEYS.tasks for d in dead)
    assert "schema version" in dead[1].reason and "invalid Task" in dead[2].reason
    assert "no 'm' field" in dead[4].reason
    assert await stream.pending() == 0 and await stream.lag() == 0
