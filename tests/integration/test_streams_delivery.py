"""Delivery rules of the streams layer against a real redis-server, with the timing a cluster can force:
every path that delivers an entry again counts deliveries and buries past `max_deliveries`; a heartbeat
never takes back an entry another consumer reclaimed; a reclaim never buries what its caller still holds;
a fenced ack is refused once a newer lease token exists, even when the lease key itself was lost."""

from __future__ import annotations

import asyncio

import pytest

from searchr1 import streams
from searchr1.core.schemas import Task
from searchr1.streams import Lease, LeaseLost, StreamKeys, read_dead

KEYS = StreamKeys("delivery")


def _stream(redis, **kw):
    kw.setdefault("visibility_timeout_ms", 100)
    kw.setdefault("max_deliveries", 3)
    return streams.tasks_stream(redis, KEYS, **kw)


def _task(i: int) -> Task:
    return Task(task_id=f"t{i}", question=f"question {i}?", golden_answers=[str(i)])


async def test_a_restarted_consumer_is_not_handed_a_crashing_entry_forever(redis):
    """A consumer that dies on an entry and restarts under its name re-reads it at once; after
    `max_deliveries` deliveries it is dead-lettered with the reason instead."""
    s = _stream(redis)
    await s.ensure_group()
    await s.publish(_task(1))
    assert len(await s.read("c1")) == 1  # delivery 1: the consumer dies on it
    handed: list[int] = []
    for _restart in range(6):
        again = _stream(redis)  # a fresh process: its first reread_own looks at its pending entries
        got = await again.reread_own("c1", held=set())
        handed += [e.deliveries for e in got]
    assert handed == [2, 3]
    dead = await read_dead(redis, KEYS.dead)
    assert len(dead) == 1 and "delivered 3 times" in dead[0].reason
    assert await s.pending() == 0


async def test_a_heartbeat_never_takes_back_an_entry_another_consumer_reclaimed(redis):
    """c2 reclaims c1's idle entry in the instant between c1's heartbeat looking and claiming: the entry
    stays c2's."""
    s = _stream(redis)
    await s.ensure_group()
    await s.publish(_task(2))
    [entry] = await s.read("c1")
    await asyncio.sleep(0.15)  # idle past the visibility timeout: c1 looks dead
    other = _stream(redis)
    real_xclaim = redis.xclaim
    raced = False

    async def reclaim_first(*args, **kw):  # the other consumer's reclaim lands right before c1's claim
        nonlocal raced
        if not raced:
            raced = True
            assert [e.id for e in await other.reclaim("c2")] == [entry.id]
        return await real_xclaim(*args, **kw)

    redis.xclaim = reclaim_first
    real_eval = redis.eval

    async def eval_after_reclaim(script, *args):
        nonlocal raced
        if not raced:
            raced = True
            assert [e.id for e in await other.reclaim("c2")] == [entry.id]
        return await real_eval(script, *args)

    redis.eval = eval_after_reclaim
    try:
        await s.heartbeat("c1", {entry.id})
    finally:
        del redis.xclaim, redis.eval
    [row] = await redis.xpending_range(s.key, s.group, "-", "+", 10)
    assert row["consumer"] == b"c2"


async def test_a_reclaim_never_buries_what_its_caller_holds(redis):
    """An entry the consumer still works on, idle past the timeout and at its delivery limit, is neither
    buried nor acked by that consumer's own reclaim."""
    s = _stream(redis, max_deliveries=1)
    await s.ensure_group()
    await s.publish(_task(3))
    [entry] = await s.read("c1")
    await asyncio.sleep(0.15)
    assert await s.reclaim("c1", held={entry.id}) == []
    assert await read_dead(redis, KEYS.dead) == []
    [row] = await redis.xpending_range(s.key, s.group, "-", "+", 10)
    assert row["consumer"] == b"c1"


@pytest.mark.parametrize("key_lost", [False, True])
async def test_a_fenced_ack_is_refused_once_a_newer_learner_holds_the_run(redis, key_lost):
    """A learner whose lease ran out (or whose lease key Redis lost) cannot ack after another learner took
    the run over: the entry stays pending for the new holder."""
    old = Lease(redis, "delivery", ttl_ms=200, holder="old")
    await old.acquire()
    s = streams.trajectories_stream(redis, KEYS, fence=old, visibility_timeout_ms=60_000, max_deliveries=3)
    await s.ensure_group()
    from tests.support.synthetic import synthetic_group

    await s.publish(synthetic_group("g", group_size=2, rewards=[1.0, 0.0]))
    [entry] = await s.read("learner")
    if key_lost:
        await redis.delete(old.key)  # a failover lost the key while the old learner still believes in it
    else:
        await asyncio.sleep(0.25)
    new = Lease(redis, "delivery", ttl_ms=10_000, holder="new")
    await new.acquire()
    with pytest.raises(LeaseLost):
        await s.ack(entry.id)
    assert await s.pending() == 1
    assert await streams.trajectories_stream(redis, KEYS, fence=new, visibility_timeout_ms=60_000, max_deliveries=3).ack(entry.id) == 1


async def test_the_learner_heartbeat_never_takes_back_a_group_another_learner_reclaimed(redis):
    from searchr1.learner.algo.staleness import StalenessPolicy
    from searchr1.learner.metrics import LearnerMetrics
    from searchr1.learner.settings import LearnerSettings
    from searchr1.learner.sources.stream import StreamSource
    from tests.support.synthetic import synthetic_group

    settings = LearnerSettings(visibility_timeout_ms=100, read_block_ms=50)
    traj = streams.trajectories_stream(redis, KEYS, visibility_timeout_ms=100, max_deliveries=3)
    source = StreamSource(settings, traj, streams.tasks_stream(redis, KEYS, visibility_timeout_ms=60_000, max_deliveries=3), StalenessPolicy.from_settings(settings),
                          LearnerMetrics())
    await source.start()
    await traj.publish(synthetic_group("g", group_size=2, rewards=[1.0, 0.0]))
    [entry] = await traj.read(settings.consumer)
    source.holding.add(entry.id)
    await asyncio.sleep(0.15)
    assert [e.id for e in await traj.reclaim("other-learner")] == [entry.id]
    await source.heartbeat()
    [row] = await redis.xpending_range(traj.key, traj.group, "-", "+", 10)
    assert row["consumer"] == b"other-learner"


async def test_a_fenced_dead_letter_is_refused_once_a_newer_learner_holds_the_run(redis):
    """A dead letter acks its entry: a stale learner cannot bury a group either; the new holder can."""
    from tests.support.synthetic import synthetic_group

    old = Lease(redis, "delivery", holder="old")
    await old.acquire()
    s = streams.trajectories_stream(redis, KEYS, fence=old, visibility_timeout_ms=60_000, max_deliveries=3)
    await s.ensure_group()
    await s.publish(synthetic_group("g", group_size=2, rewards=[1.0, 0.0]))
    [entry] = await s.read("learner")
    await redis.delete(old.key)
    new = Lease(redis, "delivery", holder="new")
    await new.acquire()
    with pytest.raises(LeaseLost):
        await s.dead_letter(entry.id, "poison")
    assert await s.pending() == 1 and await read_dead(redis, KEYS.dead) == []
    await streams.trajectories_stream(redis, KEYS, fence=new, visibility_timeout_ms=60_000, max_deliveries=3).dead_letter(entry.id, "poison")
    [dead] = await read_dead(redis, KEYS.dead)
    assert dead.reason == "poison" and dead.source_id == entry.id and await s.pending() == 0


@pytest.mark.parametrize("path", ["reclaim", "reread_own"])
@pytest.mark.parametrize("key_lost", [False, True])
async def test_a_stale_learner_cannot_bury_an_entry_past_max_deliveries(redis, path, key_lost):
    """Burying an entry delivered `max_deliveries` times acks it: on both re-delivery paths a learner
    whose lease a newer learner took over (after it ran out, or after Redis lost the key) is refused,
    the entry stays pending and the dead stream empty; the new holder buries it."""
    from tests.support.synthetic import synthetic_group

    old = Lease(redis, "delivery", ttl_ms=200, holder="old")
    await old.acquire()
    s = streams.trajectories_stream(redis, KEYS, fence=old, visibility_timeout_ms=100, max_deliveries=1)
    await s.ensure_group()
    await s.publish(synthetic_group("g", group_size=2, rewards=[1.0, 0.0]))
    [entry] = await s.read("learner")  # delivery 1 of 1: the next re-delivery buries it
    if key_lost:
        await redis.delete(old.key)
    await asyncio.sleep(0.25)  # past the visibility timeout (and the old lease's ttl)
    new = Lease(redis, "delivery", ttl_ms=10_000, holder="new")
    await new.acquire()
    stale = streams.trajectories_stream(redis, KEYS, fence=old, visibility_timeout_ms=100, max_deliveries=1)
    with pytest.raises(LeaseLost):
        if path == "reclaim":
            await stale.reclaim("learner")
        else:
            await stale.reread_own("learner", held=set())
    assert await read_dead(redis, KEYS.dead) == []
    [row] = await redis.xpending_range(s.key, s.group, "-", "+", 10)
    assert row["message_id"].decode() == entry.id and row["consumer"] == b"learner"
    current = streams.trajectories_stream(redis, KEYS, fence=new, visibility_timeout_ms=100, max_deliveries=1)
    assert await current.reread_own("learner", held=set()) == []
    [dead] = await read_dead(redis, KEYS.dead)
    assert dead.source_id == entry.id and "delivered 1 times" in dead.reason and await s.pending() == 0
