"""Poison against a real Redis: a schema-valid group with a token id past the vocabulary is dead-lettered
alone by the learner with its reason, one with an infinite behaviour log-prob is refused by the schema when
it is read (and dead-lettered too), and their batch-mates train."""

from __future__ import annotations

import asyncio
import math
import random

from searchr1.core.schemas import TrajectoryGroup, decode
from searchr1.learner.algo.staleness import StalenessPolicy
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.stream import StreamSource
from searchr1.learner.train.checkpoint import TrainState
from searchr1.streams import StreamKeys, tasks_stream, trajectories_stream
from tests.support.synthetic import synthetic_group


def _group(task: str, **change) -> TrajectoryGroup:
    g = synthetic_group(task, group_size=2, vocab=128, rewards=[1.0, 0.0], rng=random.Random(task))
    if not change:
        return g
    bad = g.trajectories[1].model_copy(update=change)
    return g.model_copy(update={"trajectories": [g.trajectories[0], bad]})


async def test_poison_groups_are_dead_lettered_alone_and_their_batch_mates_train(redis):
    settings = LearnerSettings(batch={"groups_per_step": 3}, read_block_ms=50)
    keys = StreamKeys("t")
    traj = trajectories_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    source = StreamSource(settings, traj, tasks_stream(redis, keys), StalenessPolicy.from_settings(settings),
                          LearnerMetrics(), vocab_size=128)
    await source.start()
    ok = _group("ok0")
    lp = list(_group("inf").trajectories[1].behavior_logprobs)
    lp[0] = -math.inf
    ids = list(_group("vocab").trajectories[1].response_ids)
    ids[1] = 128
    for g in (_group("ok1"), _group("vocab", response_ids=ids),
              _group("inf", behavior_logprobs=lp), _group("ok2"), ok):
        await traj.publish(g)
    step = await asyncio.wait_for(source.next_step(asyncio.Event(), TrainState()), timeout=30)
    assert sorted(g.task.task_id for g in step.groups) == ["ok0", "ok1", "ok2"]
    dead = await redis.xrange(keys.dead)
    reasons = sorted(f[b"reason"].decode() for _, f in dead)
    assert len(reasons) == 2, reasons
    assert any("token id 128 outside the vocabulary [0, 128)" in r for r in reasons), reasons
    assert any("behavior_logprobs must be finite" in r for r in reasons), reasons
    assert decode(TrajectoryGroup, next(f[b"payload"] for _, f in dead
                                        if b"token id" in f[b"reason"])).task.task_id == "vocab"
    assert source.metrics.registry.get_sample_value("searchr1_learner_groups_dropped_total",
                                                    {"reason": "poison"}) == 1


class _Dispatcher:
    """Stands in for the dispatcher and a worker: each granted task comes back as a good group."""

    exhausted = False
    budget = None  # not paced: never unfillable

    def __init__(self, publish) -> None:
        self.publish = publish
        self.granted: list[tuple[int, int]] = []
        self.tasks: set[asyncio.Task] = set()

    def grant(self, n: int, version: int) -> None:
        self.granted.append((n, version))
        for i in range(n):
            task = asyncio.get_running_loop().create_task(self.publish(_group(f"replacement{len(self.granted)}-{i}")))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)


async def test_a_group_the_schema_refuses_is_replaced_and_the_lockstep_step_trains(redis):
    """A group whose task carries the policy's vocabulary refuses its own out-of-range token id when it is
    decoded: the stream dead-letters it before the learner sees it, and the source grants its task a
    replacement, so a lockstep step that counted on it still fills."""
    settings = LearnerSettings(algorithm={"max_staleness": 0}, batch={"groups_per_step": 2}, read_block_ms=50)
    keys = StreamKeys("t")
    traj = trajectories_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    dispatcher = _Dispatcher(traj.publish)
    source = StreamSource(settings, traj, tasks_stream(redis, keys), StalenessPolicy.from_settings(settings),
                          LearnerMetrics(), vocab_size=128, dispatcher=dispatcher)
    await source.start()
    bad = _group("vocab")
    ids = list(bad.trajectories[0].response_ids)
    ids[0] = 1 << 30
    bad = bad.model_copy(update={"task": bad.task.model_copy(update={"vocab_size": 128}),
                                 "trajectories": [bad.trajectories[0].model_copy(update={"response_ids": ids}),
                                                  bad.trajectories[1]]})
    await traj.publish(_group("ok1"))
    await traj.publish(bad)
    step = await asyncio.wait_for(source.next_step(asyncio.Event(), TrainState()), timeout=30)
    assert sorted(g.task.task_id for g in step.groups) == ["ok1", "replacement1-0"]
    assert [g for g in dispatcher.granted if g[0]] == [(1, 0)]  # one task replaced, at version 0
    dead = await redis.xrange(keys.dead)
    assert len(dead) == 1 and b"is outside the vocabulary [0, 128)" in dead[0][1][b"reason"], dead


async def test_a_reward_float32_cannot_hold_and_a_group_the_batch_builder_refuses_are_buried_alone(redis):
    """A reward of 3.5e38 (finite in float64, past float32) is refused by the schema when the group is read;
    a group with a token id past int64 and no vocabulary to check it against passes the schema and the
    screen and is refused by the trial build. Each is dead-lettered alone with its own reason, its task
    replaced, and the lockstep step trains on its batch-mates and the replacements (in a batch, `build_batch`
    would raise mid-step, and restarts would dead-letter the whole step's groups as past `max_deliveries`)."""
    settings = LearnerSettings(algorithm={"max_staleness": 0}, batch={"groups_per_step": 3}, read_block_ms=50)
    keys = StreamKeys("t")
    traj = trajectories_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    dispatcher = _Dispatcher(traj.publish)
    source = StreamSource(settings, traj, tasks_stream(redis, keys), StalenessPolicy.from_settings(settings),
                          LearnerMetrics(), vocab_size=None, dispatcher=dispatcher)
    await source.start()
    ids = [2**63, *_group("wide").trajectories[1].response_ids[1:]]
    await traj.publish(_group("ok1"))
    await traj.publish(_group("huge", reward=3.5e38))
    await traj.publish(_group("wide", response_ids=ids))
    step = await asyncio.wait_for(source.next_step(asyncio.Event(), TrainState()), timeout=30)
    assert sorted(g.task.task_id for g in step.groups)[0] == "ok1" and len(step.groups) == 3
    assert sum(n for n, _ in dispatcher.granted) == 2  # both tasks replaced
    reasons = {decode(TrajectoryGroup, f[b"payload"]).task.task_id if b"Overflow" in f[b"reason"] else "huge":
               f[b"reason"].decode() for _, f in await redis.xrange(keys.dead)}
    assert len(reasons) == 2, reasons
    assert "reward 3.5e+38 is outside [-1e+18, 1e+18], the range the learner trains in" in reasons["huge"]
    assert reasons["wide"] == "the batch builder refuses it: ValueError: Overflow when unpacking long long"
