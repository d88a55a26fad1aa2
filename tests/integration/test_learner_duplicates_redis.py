"""A group is trained at most once within a step, against a real Redis: a visibility timeout shorter
than the step does not make the learner reclaim (and train again) the entries it holds; a second read in
a step checks the task ids of the first; with `checkpoint.every > 1` a read that holds only groups set
aside does not ack the groups of steps not yet checkpointed."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

from searchr1.learner.algo.staleness import StalenessPolicy
from searchr1.learner.compose import build_learner
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.parts import RedisSide
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.stream import StreamSource
from searchr1.learner.train.checkpoint import TrainState
from searchr1.streams import StreamKeys, tasks_stream, trajectories_stream
from tests.support.synthetic import synthetic_group


def _group(task: str):
    return synthetic_group(task, group_size=2, rewards=[1.0, 0.0], rng=random.Random(task))


def _source(redis, settings: LearnerSettings) -> StreamSource:
    keys = StreamKeys("t")
    traj = trajectories_stream(redis, keys, visibility_timeout_ms=settings.visibility_timeout_ms,
                               max_deliveries=settings.max_deliveries)
    return StreamSource(settings, traj, tasks_stream(redis, keys), StalenessPolicy.from_settings(settings),
                        LearnerMetrics())


async def _publish(redis, *tasks: str) -> list[str]:
    return [await trajectories_stream(redis, StreamKeys("t")).publish(_group(tid)) for tid in tasks]


async def test_a_short_visibility_timeout_does_not_train_a_held_group_twice_in_a_step(redis):
    settings = LearnerSettings(batch={"groups_per_step": 3}, visibility_timeout_ms=1, read_block_ms=50)
    source = _source(redis, settings)
    await source.start()
    await _publish(redis, "a", "b", "old")  # "old" is a replay: the step reads once more to fill it
    reading = asyncio.create_task(source.next_step(asyncio.Event(), TrainState(consumed={"old"})))
    await asyncio.sleep(0.3)  # the refill read waits for new groups; "a" and "b" are idle past 1 ms
    await _publish(redis, "c")
    step = await asyncio.wait_for(reading, timeout=30)
    assert sorted(g.task.task_id for g in step.groups) == ["a", "b", "c"]
    assert len(set(step.entry_ids)) == 3
    # a reclaim may still hand a held entry back to its holder (at 1 ms, any pause between the heartbeat
    # and the reclaim is past the timeout): it is skipped, never trained again; the heartbeat itself
    # resets the idle time of every held entry (checked without a race: the entries made idle first)
    key, group = source.trajectories.key, source.trajectories.group
    held = sorted(source.holding)
    assert len(held) == 4  # a, b, c and the set-aside replay, none acked yet
    await redis.xclaim(key, group, settings.consumer, min_idle_time=0, message_ids=held, idle=600_000, justid=True)
    await source.heartbeat()
    pending = await redis.xpending_range(key, group, "-", "+", 10)
    assert len(pending) == 4 and max(int(p["time_since_delivered"]) for p in pending) < 60_000


async def test_a_second_read_in_a_step_checks_the_first_reads_task_ids(redis):
    settings = LearnerSettings(batch={"groups_per_step": 3}, visibility_timeout_ms=60_000, read_block_ms=50)
    source = _source(redis, settings)
    await source.start()
    await _publish(redis, "a", "old", "b")
    reading = asyncio.create_task(source.next_step(asyncio.Event(), TrainState(consumed={"old"})))
    await asyncio.sleep(0.3)
    await _publish(redis, "a", "c")  # a task's group delivered twice (a re-published task)
    step = await asyncio.wait_for(reading, timeout=30)
    assert sorted(g.task.task_id for g in step.groups) == ["a", "b", "c"]


async def test_a_read_of_only_set_aside_groups_does_not_ack_uncheckpointed_steps(redis, tmp_path):
    settings = LearnerSettings(batch={"groups_per_step": 1}, checkpoint={"every": 3, "dir": str(tmp_path / "ck")},
                               read_block_ms=50, weights={"dir": str(tmp_path / "w")})
    source = _source(redis, settings)
    learner = build_learner(settings, SimpleNamespace(trainer=SimpleNamespace()), redis=RedisSide(redis), source=source)
    await source.start()
    (trained,) = await _publish(redis, "a")
    step = await source.next_step(asyncio.Event(), learner.state)
    source.commit(step.entry_ids)  # step 1 trained; its checkpoint comes at step 3
    learner.state.consumed.add("a")
    await _publish(redis, "a")  # a replay: the next read sets it aside and trains nothing
    assert await learner.step_once(asyncio.Event())
    pending = await redis.xpending_range(source.trajectories.key, source.trajectories.group, "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == [trained], "acked before its checkpoint"
