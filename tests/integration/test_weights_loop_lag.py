"""A rollout worker's event loop keeps running while it verifies and loads a 500 MB snapshot.

Real components: Redis, the weight announcement (`searchr1.weightsync.announce`), the worker loop (`Worker`),
the loader (`WeightLoader` → `fetch_snapshot`, which hashes the 500 MB safetensors file). The only
stand-in is the engine: its `reload` records the path (vLLM reloads in its engine-core process, not on
this loop; a model of this size through the real engine would not fit the test's time budget).

A probe task sleeps 5 ms at a time and records its worst overshoot; the loop must never stall more
than 50 ms while the new version is verified and loaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from searchr1.core.schemas import Task, TrajectoryGroup, WeightVersion
from searchr1.rollout.engine import TurnOutput, TurnRequest
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.rollout.sampler import GroupSampler
from searchr1.rollout.settings import AgentSettings, RewardClientSettings, TaskSettings
from searchr1.rollout.worker import Worker
from searchr1.streams import StreamKeys, TypedStream
from searchr1.weightsync import LoadSettings, WeightLoader, announce, snapshot_digest

SNAPSHOT_BYTES = 500 * 2**20
MAX_STALL_S = 0.050
PROBE_SLEEP_S = 0.005


class Codec:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class Engine:
    """Stand-in for the engine: generation is never asked for; `reload` records its path."""

    def __init__(self):
        self.reloads: list[str] = []

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        raise AssertionError("no task is published in this test")

    async def reload(self, path: str, digest=None) -> None:
        self.reloads.append(path)

    async def close(self) -> None:
        pass


@dataclass
class NoScorer:
    async def score(self, scorer, items, params=None):
        raise AssertionError("no task is published in this test")


async def _search(q):
    return []


def write_snapshot(directory: Path, size: int) -> None:
    """A safetensors file holding one F32 tensor of `size` bytes of random data, plus a config."""
    directory.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [size // 4], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    block = os.urandom(2**20)
    with (directory / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        for _ in range(size // len(block)):
            f.write(block)
    (directory / "config.json").write_text('{"model_type": "qwen2"}')


class LagProbe:
    """Sleeps `PROBE_SLEEP_S` in a loop and keeps the worst overshoot (how long the loop stalled)."""

    def __init__(self):
        self.overshoots: list[float] = []
        self._stop = asyncio.Event()

    @property
    def worst(self) -> float:
        return max(self.overshoots, default=0.0)

    async def run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(PROBE_SLEEP_S)
            self.overshoots.append(time.perf_counter() - t0 - PROBE_SLEEP_S)

    def stop(self) -> None:
        self._stop.set()


async def test_worker_loop_does_not_stall_while_loading_a_500mb_snapshot(redis, tmp_path):
    snap = tmp_path / "v1"
    await asyncio.to_thread(write_snapshot, snap, SNAPSHOT_BYTES)
    digest = await asyncio.to_thread(snapshot_digest, snap)

    keys = StreamKeys("lag")
    metrics = RolloutMetrics()
    tasks = TypedStream(redis, keys.tasks, Task, "rollout", dead_key=keys.dead, visibility_timeout_ms=60_000,
                        max_deliveries=3)
    groups = TypedStream(redis, keys.trajectories, TrajectoryGroup, "learner", dead_key=keys.dead)
    engine = Engine()
    sampler = GroupSampler(engine, Codec(), None, _search, NoScorer(), AgentSettings(), RewardClientSettings(),
                           metrics)
    loader = WeightLoader(redis, keys, engine, tmp_path / "dl", **metrics.loader_callbacks())
    worker = Worker(sampler, tasks, groups, loader, metrics, "w", TaskSettings(block_ms=20),
                    LoadSettings(poll_interval_s=0.05))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    probe = LagProbe()
    probing = None
    try:
        await asyncio.sleep(0.2)  # the worker is serving (polling tasks and weights)
        probing = asyncio.create_task(probe.run())  # from the announcement until the version is loaded
        t0 = time.monotonic()
        await announce(redis, keys, WeightVersion(version=1, uri=f"file://{snap}", sha256=digest))
        while loader.version < 1:
            assert time.monotonic() - t0 < 25, "the announced version was never loaded"
            assert not run.done(), run.exception()
            await asyncio.sleep(0.01)
    finally:
        probe.stop()
        if probing is not None:
            await probing
        stop.set()
        await asyncio.wait_for(run, 10)
    assert engine.reloads == [str(tmp_path / "dl" / f"v00000001-{digest[:16]}")]  # the verified links
    assert len(probe.overshoots) > 10
    worst = sorted(probe.overshoots, reverse=True)[:3]
    assert probe.worst < MAX_STALL_S, (f"event loop stalled {probe.worst * 1000:.0f} ms while loading weights "
                                       f"(worst three: {[round(x * 1000) for x in worst]} ms)")
