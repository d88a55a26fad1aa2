"""The trim of acked entries reads the consumer groups and trims in one atomic step, against a real Redis:
a group created at id 0 while a trim is under way keeps every entry it has not read."""

from __future__ import annotations

from searchr1 import streams
from searchr1.core.schemas import Task
from searchr1.streams import StreamKeys, group_views, safe_min_id

KEYS = StreamKeys("trim")


async def test_a_group_created_during_a_trim_keeps_its_unread_entries(redis):
    s = streams.tasks_stream(redis, KEYS)
    await s.ensure_group()
    for i in range(5):
        await s.publish(Task(task_id=f"t{i}", question="q?", golden_answers=["a"]))
    await s.ack(*[e.id for e in await s.read("w", count=5)])  # the rollout group is done with all five
    created = False

    def create_late_group(original):
        async def wrapped(*args, **kw):
            nonlocal created
            if not created:  # another service creates its group at id 0 while the trim is under way
                created = True
                await redis.xgroup_create(s.key, "late", id="0")
            return await original(*args, **kw)
        return wrapped

    redis.xtrim, redis.eval = create_late_group(redis.xtrim), create_late_group(redis.eval)
    try:
        await s.trim()
    finally:
        del redis.xtrim, redis.eval
    assert created and await s.length() == 5  # "late" has read none of them: none may go


async def test_the_trim_deletes_exactly_what_the_rule_allows(redis):
    s = streams.tasks_stream(redis, KEYS)
    await s.ensure_group()
    other = streams.TypedStream(redis, KEYS.tasks, Task, "other", dead_key=KEYS.dead)
    await other.ensure_group()
    ids = [await s.publish(Task(task_id=f"t{i}", question="q?", golden_answers=["a"])) for i in range(8)]
    read = await s.read("w", count=6)
    await s.ack(*[e.id for e in read if e.id not in (ids[2],)])  # t2 stays pending in "rollout"
    await other.ack(*[e.id for e in await other.read("o", count=4)])  # "other" has read (and acked) four
    bound = safe_min_id(await group_views(redis, s.key))
    assert bound == ids[2]
    assert await s.trim() == 2 and await s.length() == 6
    assert [i for i, _ in await redis.xrange(s.key)][0].decode() == ids[2]
