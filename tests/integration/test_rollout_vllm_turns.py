"""Resumed turns on a real vLLM CPU engine with the default engine settings (the tiny random Qwen2, steered
into the Search-R1 structure so it searches): the engine runs with `CPU_BLOCK_SIZE`-token KV blocks, so a
resumed turn recomputes less than one block of the context it had already computed (plus the new
environment tokens); a turn ending at a tag stops in the engine core at the step that sampled it (the
engine samples no token that is discarded), and the trajectory is the one the text-matched stop strings
give alone (same ids, mask, finish, log-probs)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

from searchr1.rollout.agent import AgentLimits, Sampling, run_trajectory
from searchr1.rollout.engine import HfCodec
from searchr1.rollout.settings import AgentSettings
from searchr1.rollout.tools.steering import steer_args, word_tokens
from searchr1.rollout.vllm_engine import CPU_BLOCK_SIZE, VllmGenerator
from tests.support.rollout_stack import QUESTIONS, start_vllm
from tests.support.tiny_lm import build_tiny_lm

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS = AgentLimits.from_settings(AgentSettings(max_turns=3, max_tokens_per_turn=64, max_obs_tokens=200, max_response_tokens=2048))
OBSERVATION_DOCS = ['"Paris"\nParis is the capital and most populous city of France.',
                    '"Berlin"\nBerlin is the capital and largest city of Germany.']


@dataclass(frozen=True, slots=True)
class Hit:
    contents: str


async def search(query: str) -> list[Hit]:
    return [Hit(d) for d in OBSERVATION_DOCS]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory):
    from transformers import AutoTokenizer

    model = build_tiny_lm(tmp_path_factory.mktemp("tiny") / "m")
    gen = await start_vllm(model, max_num_seqs=8)
    tok = AutoTokenizer.from_pretrained(model)
    yield gen, tok, EngineTokens(gen.engine)  # before any request: it sees every message
    await gen.close()


class EngineTokens:
    """Counts every token the engine core samples (kept or discarded), from the messages its client
    receives."""

    def __init__(self, engine) -> None:
        self.sampled = 0
        client = engine.engine_core
        inner = client.get_output_async

        async def counted():
            outs = await inner()
            self.sampled += sum(len(o.new_token_ids) for o in outs.outputs)
            return outs

        client.get_output_async = counted


@dataclass
class Recorder:
    """An `AsyncLLM` wrapper recording, per request, its prompt and the prompt tokens the prefix cache
    served."""

    engine: object
    requests: list[tuple[list[int], int]] = field(default_factory=list)
    stop_token_ids: list[list[int] | None] = field(default_factory=list)

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt, params, request_id, **kwargs):
        last = None
        async with contextlib.aclosing(self.engine.generate(prompt, params, request_id, **kwargs)) as stream:
            async for out in stream:
                last = out
                yield out
        self.requests.append((list(prompt["prompt_token_ids"]), last.num_cached_tokens or 0))
        self.stop_token_ids.append(params.stop_token_ids)


async def _trajectories(gen: VllmGenerator, tok, n: int):
    codec = HfCodec(tok)
    extra = steer_args(tok, p_search=1.0, max_searches=LIMITS.max_turns, search_tokens=word_tokens(tok))
    prompts = [codec.encode(f"{QUESTIONS[i % len(QUESTIONS)][0]}?") for i in range(n)]
    return await asyncio.gather(*[
        run_trajectory(p, gen, codec, search, LIMITS, Sampling.from_settings(AgentSettings(extra_args=extra), seed=11 + i), f"traj-{i}")
        for i, p in enumerate(prompts)])


async def test_the_engine_runs_small_blocks_and_a_resumed_turn_recomputes_less_than_one(stack):
    gen, tok, _ = stack
    assert gen.engine.vllm_config.cache_config.block_size == CPU_BLOCK_SIZE
    await gen.engine.reset_prefix_cache()
    rec = Recorder(gen.engine)
    resumed = VllmGenerator(rec, gen.eos_token_ids, gen.extension, stop_ids=gen.stop_ids)
    (res,) = await _trajectories(resumed, tok, 1)
    assert res.num_searches >= 2 and len(rec.requests) == res.num_turns
    for (before, _), (after, cached) in zip(rec.requests, rec.requests[1:]):
        assert after[:len(before)] == before
        turn = slice(len(before) - len(res.prompt_ids), len(after) - len(res.prompt_ids))
        sampled = sum(res.loss_mask[turn])
        new_env = len(after) - len(before) - sampled
        computed = len(before) + sampled - 1  # the turn's last sampled token never went through the model
        assert cached >= computed - computed % CPU_BLOCK_SIZE  # every full block already computed is served
        assert len(after) - cached < new_env + 1 + CPU_BLOCK_SIZE


async def test_a_tag_stops_the_turn_in_the_engine_and_changes_nothing_in_the_trajectory(stack):
    gen, tok, engine_tokens = stack
    assert set(gen.stop_ids) == {"</search>", "</answer>"}
    before = engine_tokens.sampled
    rec = Recorder(gen.engine)
    fast = await _trajectories(VllmGenerator(rec, gen.eos_token_ids, gen.extension, stop_ids=gen.stop_ids), tok, 4)
    assert sum(r.num_turns for r in fast) >= 8
    tags = [tok.convert_tokens_to_ids(s) for s in ("</search>", "</answer>")]
    assert rec.stop_token_ids == [tags] * len(rec.requests)
    assert engine_tokens.sampled - before == sum(r.generated_tokens for r in fast)  # nothing sampled past a tag
    text_only = await _trajectories(VllmGenerator(gen.engine, gen.eos_token_ids, gen.extension), tok, 4)
    for a, b in zip(fast, text_only):
        assert (a.response_ids, a.loss_mask, a.finish_reason, a.num_turns) == \
            (b.response_ids, b.loss_mask, b.finish_reason, b.num_turns)
        assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-4)
