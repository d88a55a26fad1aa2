"""A task the rollout workers dead-letter is replaced, and never dealt out again (real Redis, the real
dispatcher, the learner's stream source in lockstep).

A stand-in worker reads the tasks stream as a rollout worker does (reclaim, then read; publish the group,
then ack) and never acks the poison task, so the tasks stream's own reclaim buries it after
`max_deliveries`. Without a replacement the lockstep learner (a budget of `groups_per_step` tasks,
`max_staleness = 0`) would wait for the poison task's group for good."""

from __future__ import annotations

import asyncio
import contextlib
import random

from searchr1.core.datasets import Question
from searchr1.learner.algo.staleness import StalenessPolicy
from searchr1.learner.dispatcher import Dispatcher
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.settings import DispatcherSettings, LearnerSettings
from searchr1.learner.sources.stream import StreamSource
from searchr1.learner.tools.dead_tasks import DeadTasks, read_dead_tasks
from searchr1.learner.train.checkpoint import TrainState
from searchr1.streams import StreamKeys, tasks_stream, trajectories_stream
from tests.support.synthetic import synthetic_group

QUESTIONS = [Question(f"q{i}", f"question {i}?", ["a"]) for i in range(6)]


async def _worker(tasks, traj, poison: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        got = await tasks.reclaim("w0", count=4) + await tasks.read("w0", count=4, block_ms=50)
        for e in got:
            if e.value.task_id.startswith(poison + "@"):
                continue  # the engine crashes on it: never acked, reclaimed, buried at max_deliveries
            # sampled with the weights the task asks for (lockstep: the learner's current version)
            await traj.publish(synthetic_group(e.value.task_id, group_size=2, vocab=128, rewards=[1.0, 0.0],
                                               policy_version=e.value.min_policy_version,
                                               rng=random.Random(e.value.task_id)))
            await tasks.ack(e.id)


async def test_a_dead_lettered_task_is_replaced_and_the_lockstep_step_fills(redis, tmp_path):
    keys = StreamKeys("t")
    settings = LearnerSettings(algorithm={"max_staleness": 0}, batch={"groups_per_step": 2}, read_block_ms=50,
                               dispatcher={"group_size": 2, "poll_s": 0.05, "seed": 3})
    tasks = tasks_stream(redis, keys, visibility_timeout_ms=100, max_deliveries=2)
    traj = trajectories_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    record = tmp_path / "t.dead-tasks"
    metrics = LearnerMetrics()
    staleness = StalenessPolicy.from_settings(settings)
    dispatcher = Dispatcher(tasks, QUESTIONS, settings.dispatcher, staleness=staleness,
                            dead=DeadTasks(record, tasks.burials(), tasks),
                            on_replace=lambda n: metrics.tasks_replaced.labels("dead_lettered").inc(n))
    # the poison is one of the first step's two tasks, so that step can only fill with its replacement
    poison = QUESTIONS[dispatcher._order[0]].task_id
    source = StreamSource(settings, traj, tasks, staleness, metrics, dispatcher=dispatcher)
    await source.start()
    stop, halt = asyncio.Event(), asyncio.Event()
    feeding = asyncio.create_task(dispatcher.run(halt, downstream=source))
    working = asyncio.create_task(_worker(tasks, traj, poison, halt))
    state = TrainState()
    trained: list[str] = []
    try:
        for _ in range(3):
            step = await asyncio.wait_for(source.next_step(stop, state), timeout=60)
            assert step is not None and len(step.groups) == 2
            state.step += 1
            state.version += 1
            ids = [g.task.task_id for g in step.groups]
            state.consumed.update(ids)
            trained += ids
            source.commit(step.entry_ids)
            await source.ack()
            source.grant(len(step.groups), state.version)
    finally:
        halt.set()
        for t in (feeding, working):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(t, 10)
    assert f"{poison}@e0" not in trained and len(set(trained)) == 6
    assert dispatcher.replaced == 1
    assert metrics.registry.get_sample_value("searchr1_learner_tasks_replaced_total",
                                             {"reason": "dead_lettered"}) == 1
    dead = read_dead_tasks(record)
    assert list(dead) == [f"{poison}@e0"]
    assert "delivered 2 times without ack (max_deliveries=2)" in dead[f"{poison}@e0"]

    # a restart publishes again from the checkpoint's position (here: the start): the dead task is skipped,
    # from the record on disk even once Redis has lost the dead stream
    await redis.delete(keys.dead)
    await redis.delete(keys.tasks)
    again = Dispatcher(tasks, QUESTIONS, DispatcherSettings(group_size=2, seed=3, max_inflight=5),
                       dead=DeadTasks(record, tasks.burials(), tasks))
    again.restore({"epoch": 0, "cursor": 0}, 0)
    await tasks.ensure_group()
    assert await again.dead.start() == {f"{poison}@e0"}
    assert await again.fill() == 5
    published = [e.value.task_id for e in await tasks.read("w1", count=10)]
    assert f"{poison}@e0" not in published and len(published) == 5
    assert again.skipped == 1 and again.epoch == 1  # the whole first epoch dealt out, the poison left out


async def test_a_step_whose_tasks_were_lost_gets_replacements(redis, caplog):
    """Redis loses the tasks stream after the dispatcher published a lockstep step's tasks (a restore from an
    older copy, a new instance): nothing is in flight, nothing unread, and the paced dispatcher has no budget
    left. The waiting read names that and, once it has held for `UNFILLABLE_AFTER_S`, grants what the step
    lacks. The source's clock runs 20 times faster than the wall's."""
    import time

    keys = StreamKeys("t")
    settings = LearnerSettings(algorithm={"max_staleness": 0}, batch={"groups_per_step": 2}, read_block_ms=50,
                               dispatcher={"group_size": 2, "poll_s": 0.05})
    tasks = tasks_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    traj = trajectories_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    metrics = LearnerMetrics()
    staleness = StalenessPolicy.from_settings(settings)
    dispatcher = Dispatcher(tasks, QUESTIONS, settings.dispatcher, staleness=staleness)
    source = StreamSource(settings, traj, tasks, staleness, metrics, dispatcher=dispatcher,
                          clock=lambda: time.monotonic() * 20)
    await source.start()
    assert await dispatcher.fill() == 2 and dispatcher.budget == 0
    await redis.delete(keys.tasks)  # the data loss: both tasks gone
    await tasks.ensure_group()
    halt = asyncio.Event()
    feeding = asyncio.create_task(dispatcher.run(halt, downstream=source))
    working = asyncio.create_task(_worker(tasks, traj, "none", halt))
    try:
        step = await asyncio.wait_for(source.next_step(asyncio.Event(), TrainState()), timeout=60)
    finally:
        halt.set()
        for t in (feeding, working):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(t, 10)
    assert step is not None and len(step.groups) == 2
    assert metrics.registry.get_sample_value("searchr1_learner_tasks_replaced_total", {"reason": "unfillable"}) == 2
    assert ("step 1 cannot fill: waiting for the groups of step 1: 0 of 2 read; 0 task(s) queued or in rollout, "
            "0 group(s) unread; dispatcher budget 0, and no task is left to publish") in caplog.text


async def test_a_buried_copy_of_a_task_whose_group_the_learner_holds_is_not_replaced(redis, tmp_path):
    """After a restart the dispatcher publishes again from the checkpoint's position: a copy of a task whose
    first group the learner re-reads and trains. Burying that copy must not put one task too many ahead
    (in lockstep, one group stale at every step from then on)."""
    keys = StreamKeys("t")
    settings = LearnerSettings(algorithm={"max_staleness": 0}, batch={"groups_per_step": 1},
                               dispatcher={"group_size": 2})
    tasks = tasks_stream(redis, keys)
    dispatcher = Dispatcher(tasks, QUESTIONS, settings.dispatcher, staleness=StalenessPolicy.from_settings(settings),
                            dead=DeadTasks(tmp_path / "t.dead-tasks", tasks.burials(), tasks))
    await tasks.ensure_group()
    await dispatcher.dead.start()
    assert await dispatcher.fill() == 1 and dispatcher.budget == 0
    [entry] = await tasks.read("w0", count=1)
    await tasks.dead_letter(entry.id, "delivered 3 times without ack (max_deliveries=3)")

    class Source:
        def __init__(self, held: set[str]) -> None:
            self.held = held

        def settled(self, task_id: str) -> bool:
            return task_id in self.held

    assert await dispatcher.replace_dead(Source({entry.value.task_id})) == 0 and dispatcher.budget == 0
    # the same burial for a task the learner does not hold is replaced
    assert await dispatcher.fill() == 0
    dispatcher.budget = 1
    assert await dispatcher.fill() == 1
    [second] = await tasks.read("w0", count=1)
    await tasks.dead_letter(second.id, "delivered 3 times without ack (max_deliveries=3)")
    assert await dispatcher.replace_dead(Source(set())) == 1 and dispatcher.budget == 1
