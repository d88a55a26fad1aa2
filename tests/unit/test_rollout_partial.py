"""Interruptible rollouts' bookkeeping over a scripted token-by-token engine: a swap interrupts a running
turn at a token boundary, waits for the load, and resumes the turn from its prefix with the rest of its
budget; each token carries its version; the agent turns them into segments and the worker's group is as
old as its oldest segment. The real-engine test is tests/integration/test_rollout_partial_vllm.py."""

from __future__ import annotations

import asyncio

import pytest

from searchr1.core.schemas import Trajectory
from searchr1.rollout.agent import AgentLimits, TrajectoryResult, run_trajectory
from searchr1.rollout.engine import TurnOutput, TurnRequest
from searchr1.rollout.partial import RESUME_SEED_STRIDE, InterruptibleGenerator
from searchr1.rollout.settings import AgentSettings


class TickingEngine:
    """Samples token `100 + len(prompt)` each tick (log-prob −version/10 − 0.01), honouring `interrupt`."""

    def __init__(self) -> None:
        self.version = 0
        self.requests: list[tuple[str, TurnRequest]] = []
        self.tick = asyncio.Event()
        self.reloads: list[str] = []

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        self.requests.append((request_id, request))
        ids: list[int] = []
        for _ in range(request.max_tokens):
            await self.tick.wait()
            self.tick.clear()
            if request.interrupt is not None and request.interrupt.is_set():
                return TurnOutput(ids, [-self.version / 10 - 0.01] * len(ids), "x" * len(ids), "interrupted")
            ids.append(100 + len(request.prompt_ids) + len(ids))
            await asyncio.sleep(0)
        return TurnOutput(ids, [-self.version / 10 - 0.01] * len(ids), "x" * len(ids), "length")

    async def reload(self, weights_path: str, digest=None) -> None:
        self.reloads.append(weights_path)
        self.version += 1

    async def close(self) -> None:
        return None


async def _ticks(engine: TickingEngine, n: int) -> None:
    for _ in range(n):
        engine.tick.set()
        for _ in range(5):
            await asyncio.sleep(0)


async def test_a_swap_interrupts_a_turn_and_it_resumes_from_its_prefix_under_the_new_version():
    engine = TickingEngine()
    gen = InterruptibleGenerator(engine, version=0)
    turn = asyncio.create_task(gen.generate(TurnRequest(prompt_ids=[1, 2], max_tokens=6, temperature=1.0, top_p=1.0,
                                                        top_k=-1, seed=7), "t0"))
    await _ticks(engine, 3)  # three tokens under version 0

    async def load() -> bool:
        await engine.reload("/w/v1")
        return True

    swap = asyncio.create_task(gen.swap(load, lambda: engine.version))
    await _ticks(engine, 1)  # the running turn sees the interrupt at its next token and returns
    assert await swap is True and gen.version == 1 and gen.swaps == 1
    await _ticks(engine, 3)
    out = await turn
    assert out.token_ids == [102, 103, 104, 105, 106, 107]
    assert out.versions == [0, 0, 0, 1, 1, 1]
    assert out.logprobs == pytest.approx([-0.01] * 3 + [-0.11] * 3)
    assert out.finish == "length" and gen.interruptions == 1
    (id0, first), (id1, resumed) = engine.requests
    assert (id0, id1) == ("t0", "t0-r1")
    assert list(resumed.prompt_ids) == [1, 2, 102, 103, 104] and resumed.max_tokens == 3
    assert first.seed == 7 and resumed.seed == 7 + RESUME_SEED_STRIDE


async def test_a_turn_asked_for_during_a_swap_waits_for_the_new_weights():
    engine = TickingEngine()
    gen = InterruptibleGenerator(engine, version=4)
    loaded = asyncio.Event()

    async def load() -> None:
        await loaded.wait()

    swap = asyncio.create_task(gen.swap(load, lambda: 5))
    await asyncio.sleep(0)
    turn = asyncio.create_task(gen.generate(TurnRequest(prompt_ids=[1], max_tokens=2, temperature=1.0, top_p=1.0, top_k=-1), "late"))
    await _ticks(engine, 2)
    assert engine.requests == []  # held until the weights are in
    loaded.set()
    await swap
    await _ticks(engine, 2)
    assert (await turn).versions == [5, 5]


async def test_a_swap_with_nothing_running_loads_at_once():
    engine = TickingEngine()
    gen = InterruptibleGenerator(engine, version=0)
    assert await gen.swap(lambda: engine.reload("/w/v1"), lambda: engine.version) is None
    assert engine.reloads == ["/w/v1"] and gen.version == 1


async def test_the_agent_records_the_seam_as_two_segments_and_they_validate():
    engine = TickingEngine()
    gen = InterruptibleGenerator(engine, version=2)

    class Codec:
        def encode(self, text: str) -> list[int]:
            return [9] * len(text)

        def decode(self, ids) -> str:
            return "x" * len(ids)

    async def no_search(query: str):
        return []

    limits = AgentLimits.from_settings(AgentSettings(max_turns=1, max_tokens_per_turn=5, max_response_tokens=5))
    run = asyncio.create_task(run_trajectory([1, 2, 3], gen, Codec(), no_search, limits))
    await _ticks(engine, 2)
    swap = asyncio.create_task(gen.swap(lambda: engine.reload("/w"), lambda: 3))
    await _ticks(engine, 1)
    await swap
    await _ticks(engine, 3)
    res: TrajectoryResult = await run
    assert res.finish_reason == "length" and res.segments() == [(0, 2, 2), (2, 5, 3)]
    t = Trajectory(prompt_ids=res.prompt_ids, response_ids=res.response_ids, loss_mask=res.loss_mask,
                   behavior_logprobs=res.behavior_logprobs, segments=res.segments())
    assert t.behavior_logprobs == pytest.approx([-0.01, -0.01, -0.11, -0.11, -0.11])


def test_a_result_without_versions_has_no_segments():
    res = TrajectoryResult(prompt_ids=[1])
    res.add_sampled([5, 6], [-0.1, -0.2])
    res.add_env([7])
    assert res.segments() == []
    res2 = TrajectoryResult(prompt_ids=[1])
    res2.add_sampled([5], [-0.1], [3])
    res2.add_env([7])
    res2.add_sampled([8], [-0.1], [3])
    assert res2.segments() == [(0, 3, 3)]
