"""The worker loop with `partial` rollouts on a real Redis (fast, a scripted token-by-token engine, no
vLLM): a weight version announced while a group is generating does not wait for it — the turns in flight
are interrupted, the engine reloads, they resume — and the published group's trajectories carry two
segments, its `policy_version` the oldest. The same push without `partial` waits for the group (one
version, no segments)."""

from __future__ import annotations

import asyncio
import time

from searchr1.core.schemas import Task, TrajectoryGroup, WeightVersion
from searchr1.rollout.engine import TurnOutput, TurnRequest
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.rollout.partial import InterruptibleGenerator
from searchr1.rollout.sampler import GroupSampler
from searchr1.rollout.settings import AgentSettings, RewardClientSettings, TaskSettings
from searchr1.rollout.worker import Worker
from searchr1.streams import StreamKeys, tasks_stream, trajectories_stream
from searchr1.weightsync import LoadSettings, WeightLoader, announce, snapshot_digest

ANSWER = "<answer> Paris </answer>"


class Codec:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class SlowGen:
    """Emits the answer one character per 30 ms, continuing where an interrupted request of the same
    turn stopped; honours `interrupt`."""

    def __init__(self) -> None:
        self.emitted: dict[str, int] = {}
        self.reloads: list[str] = []
        self.reloaded_while_generating = False
        self.running = 0
        self.interrupted = 0.0

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        root = request_id.split("-r")[0]
        ids: list[int] = []
        self.running += 1
        try:
            while self.emitted.get(root, 0) < len(ANSWER) and len(ids) < request.max_tokens:
                await asyncio.sleep(0.03)
                if request.interrupt is not None and request.interrupt.is_set():
                    return TurnOutput(ids, [-0.5] * len(ids), "".join(map(chr, ids)), "interrupted")
                ids.append(ord(ANSWER[self.emitted.get(root, 0)]))
                self.emitted[root] = self.emitted.get(root, 0) + 1
        finally:
            self.running -= 1
        return TurnOutput(ids, [-0.5] * len(ids), "".join(map(chr, ids)), "stop", "</answer>")

    async def reload(self, path: str, digest=None) -> None:
        self.reloaded_while_generating |= any(0 < n < len(ANSWER) for n in self.emitted.values())
        self.reloads.append(path)

    async def close(self) -> None:
        pass


class OkScorer:
    async def score(self, scorer, items, params=None):
        class R:
            scores = [1.0] * len(items)
            components = [{"em": 1.0}] * len(items)

        return R()


async def _search(q):
    return []


async def _run(redis, tmp_path, *, partial: bool) -> tuple[TrajectoryGroup, SlowGen]:
    keys = StreamKeys("partial" if partial else "whole")
    gen = SlowGen()
    metrics = RolloutMetrics()
    tasks, groups = tasks_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3), trajectories_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    engine = InterruptibleGenerator(gen, 0, on_interrupt=metrics.turns_interrupted.inc) if partial else None
    sampler = GroupSampler(engine or gen, Codec(), None, _search, OkScorer(), AgentSettings(), RewardClientSettings(),
                           metrics)
    loader = WeightLoader(redis, keys, gen, tmp_path / "dl", **metrics.loader_callbacks())
    worker = Worker(sampler, tasks, groups, loader, metrics, "w", TaskSettings(block_ms=50),
                    LoadSettings(poll_interval_s=0.05), partial=engine)
    await tasks.ensure_group()
    await groups.ensure_group()
    await tasks.publish(Task(task_id="t", question="q", golden_answers=["Paris"], group_size=2))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        end = time.monotonic() + 20
        while min(gen.emitted.values(), default=0) < 5:  # both trajectories are mid-answer
            assert time.monotonic() < end, "generation never started"
            await asyncio.sleep(0.01)
        snap = tmp_path / f"v1-{partial}"
        snap.mkdir()
        (snap / "model.safetensors").write_bytes(b"weights v1")
        await announce(redis, keys, WeightVersion(version=1, uri=str(snap), sha256=snapshot_digest(snap)))
        while not (got := await groups.read("t", count=5, block_ms=100)):
            assert time.monotonic() < end, "no group published"
        assert len(got) == 1
        while loader.version != 1:
            assert time.monotonic() < end, "the weights were never loaded"
            await asyncio.sleep(0.01)
        gen.interrupted = metrics.turns_interrupted._value.get()
        return got[0].value, gen
    finally:
        stop.set()
        await asyncio.wait_for(run, 10)


async def test_a_push_mid_group_interrupts_and_resumes_its_turns_with_partial_rollouts(redis, tmp_path):
    group, gen = await _run(redis, tmp_path, partial=True)
    assert gen.reloaded_while_generating and len(gen.reloads) == 1
    assert gen.interrupted == 2  # both trajectories' turns, counted in the worker's metrics
    assert group.policy_version == 0  # the oldest version behind its tokens
    for t in group.trajectories:
        (s0, seam, v0), (s1, end, v1) = t.segments
        assert (s0, v0, s1, v1, end) == (0, 0, seam, 1, len(ANSWER)) and 5 <= seam < len(ANSWER)
        assert "".join(map(chr, t.response_ids)) == ANSWER and t.finish_reason == "answer"


async def test_without_partial_rollouts_the_push_waits_for_the_group(redis, tmp_path):
    group, gen = await _run(redis, tmp_path, partial=False)
    assert not gen.reloaded_while_generating and len(gen.reloads) == 1
    assert group.policy_version == 0
    assert all(t.segments == [] for t in group.trajectories)
