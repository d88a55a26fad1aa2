"""A rollout worker heartbeats the tasks it holds from read to ack, through weight loads and partial-rollout
swaps, against a real Redis with a fake engine whose reload takes five visibility timeouts: a task read
just before a load (it needs the newer weights), or held in flight through a swap, is never reclaimed by
another worker meanwhile, and is run once."""

from __future__ import annotations

import asyncio
import time

from searchr1.core.schemas import Task, WeightVersion
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.rollout.sampler import GroupSampler
from searchr1.rollout.settings import AgentSettings, RewardClientSettings, TaskSettings
from searchr1.rollout.worker import Worker
from searchr1.streams import StreamKeys, tasks_stream, trajectories_stream
from searchr1.weightsync import LoadSettings, WeightLoader, announce, snapshot_digest
from tests.integration.test_rollout_worker_redis import Codec, Gen, OkScorer, _search

VISIBILITY_MS = 300
RELOAD_S = 1.5  # five visibility timeouts


class SlowReloadGen(Gen):
    async def reload(self, path, digest=None):
        await asyncio.sleep(RELOAD_S)
        await super().reload(path, digest)


async def test_a_task_read_before_a_weight_load_is_heartbeaten_through_the_load(redis, tmp_path):
    keys = StreamKeys("hbload")
    snap = tmp_path / "v1"
    snap.mkdir()
    (snap / "model.safetensors").write_bytes(b"weights")
    digest = await asyncio.to_thread(snapshot_digest, snap)
    metrics = RolloutMetrics()
    tasks = tasks_stream(redis, keys, visibility_timeout_ms=VISIBILITY_MS, max_deliveries=3)
    groups = trajectories_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    gen = SlowReloadGen()
    sampler = GroupSampler(gen, Codec(), None, _search, OkScorer(), AgentSettings(), RewardClientSettings(), metrics)
    loader = WeightLoader(redis, keys, gen, tmp_path / "dl", **metrics.loader_callbacks())
    worker = Worker(sampler, tasks, groups, loader, metrics, "w1",
                    TaskSettings(block_ms=50, reclaim_interval_s=3600), LoadSettings(poll_interval_s=3600),
                    heartbeat_s=VISIBILITY_MS / 4000)
    await tasks.ensure_group()
    await groups.ensure_group()
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(0.3)  # serving; its next weight poll is an hour away
    await announce(redis, keys, WeightVersion(version=1, uri=f"file://{snap}", sha256=digest))
    await tasks.publish(Task(task_id="a", question="capital of france", golden_answers=["Paris"], group_size=2,
                             min_policy_version=1))
    other = tasks_stream(redis, keys, visibility_timeout_ms=VISIBILITY_MS, max_deliveries=3)
    stolen = []
    end = time.monotonic() + 20
    got = []
    while not got:
        assert time.monotonic() < end and not run.done(), "the task was never run"
        stolen += await other.reclaim("w2")
        got = await groups.read("t", count=5, block_ms=20)
    stop.set()
    await asyncio.wait_for(run, 10)
    assert stolen == [], "another worker reclaimed a task the loading worker held"
    assert [e.value.task.task_id for e in got] == ["a"]
    assert gen.reloads  # the load did happen while the task was held


async def test_tasks_held_through_a_partial_rollout_swap_are_heartbeaten(redis, tmp_path):
    """With partial rollouts a swap interrupts the turns in flight and holds their tasks for the whole
    load: they are heartbeaten meanwhile, never reclaimed, and published once."""
    from searchr1.rollout.partial import InterruptibleGenerator
    from tests.integration.test_rollout_partial_redis import Codec as CharCodec
    from tests.integration.test_rollout_partial_redis import SlowGen

    class SlowSwapGen(SlowGen):
        async def reload(self, path, digest=None):
            await asyncio.sleep(RELOAD_S)
            await super().reload(path, digest)

    keys = StreamKeys("hbswap")
    gen = SlowSwapGen()
    metrics = RolloutMetrics()
    tasks = tasks_stream(redis, keys, visibility_timeout_ms=VISIBILITY_MS, max_deliveries=3)
    groups = trajectories_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    engine = InterruptibleGenerator(gen, 0, on_interrupt=metrics.turns_interrupted.inc)
    sampler = GroupSampler(engine, CharCodec(), None, _search, OkScorer(), AgentSettings(), RewardClientSettings(),
                           metrics)
    loader = WeightLoader(redis, keys, gen, tmp_path / "dl", **metrics.loader_callbacks())
    worker = Worker(sampler, tasks, groups, loader, metrics, "w1",
                    TaskSettings(block_ms=50, reclaim_interval_s=3600), LoadSettings(poll_interval_s=0.05),
                    heartbeat_s=VISIBILITY_MS / 4000, partial=engine)
    await tasks.ensure_group()
    await groups.ensure_group()
    await tasks.publish(Task(task_id="t", question="q", golden_answers=["Paris"], group_size=2))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    other = tasks_stream(redis, keys, visibility_timeout_ms=VISIBILITY_MS, max_deliveries=3)
    stolen, got = [], []
    end = time.monotonic() + 30
    while min(gen.emitted.values(), default=0) < 5:  # both trajectories are mid-answer
        assert time.monotonic() < end, "generation never started"
        await asyncio.sleep(0.01)
    snap = tmp_path / "v1"
    snap.mkdir()
    (snap / "model.safetensors").write_bytes(b"weights v1")
    await announce(redis, keys, WeightVersion(version=1, uri=str(snap), sha256=snapshot_digest(snap)))
    while not got:
        assert time.monotonic() < end and not run.done(), "no group published"
        stolen += await other.reclaim("w2")
        got = await groups.read("t", count=5, block_ms=20)
    stop.set()
    await asyncio.wait_for(run, 10)
    assert stolen == [], "another worker reclaimed a task held through the swap"
    assert gen.reloaded_while_generating and len(got) == 1
