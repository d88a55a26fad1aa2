"""A learner restarted after a crash takes the groups still pending for its consumer back at once,
against a real Redis, not after the visibility timeout (the lease makes the consumer name its own)."""

from __future__ import annotations

import asyncio
import random

from searchr1.learner.algo.staleness import StalenessPolicy
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.stream import StreamSource
from searchr1.learner.train.checkpoint import TrainState
from searchr1.streams import RedisLink, StreamKeys, tasks_stream, trajectories_stream
from tests.support.synthetic import synthetic_group


def _source(redis, settings: LearnerSettings) -> StreamSource:
    keys, link = StreamKeys("t"), RedisLink("learner")
    traj = trajectories_stream(redis, keys, link=link, visibility_timeout_ms=settings.visibility_timeout_ms,
                               max_deliveries=3)
    return StreamSource(settings, traj, tasks_stream(redis, keys, link=link),
                        StalenessPolicy.from_settings(settings), LearnerMetrics())


async def test_a_restarted_learner_trains_its_own_pending_groups_at_once(redis):
    settings = LearnerSettings(batch={"groups_per_step": 2}, visibility_timeout_ms=600_000, read_block_ms=50)
    producer = trajectories_stream(redis, StreamKeys("t"))
    crashed = _source(redis, settings)
    await crashed.start()
    for tid in ("a", "b"):
        await producer.publish(synthetic_group(tid, group_size=2, rewards=[1.0, 0.0], rng=random.Random(tid)))
    first = await crashed.next_step(asyncio.Event(), TrainState())
    assert len(first.groups) == 2  # read, never acked: the process dies here

    restarted = _source(redis, settings)
    await restarted.start()
    step = await asyncio.wait_for(restarted.next_step(asyncio.Event(), TrainState()), timeout=20)
    assert sorted(g.task.task_id for g in step.groups) == ["a", "b"]
    assert sorted(step.entry_ids) == sorted(first.entry_ids)
