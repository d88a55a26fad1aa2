"""Interruptible rollouts on a real vLLM CPU engine: a weight push in the middle of a long greedy turn
interrupts it at a token boundary, the engine reloads, and the turn resumes from its prefix under the new
weights. The trajectory has two segments; the tokens before the seam are the old weights' greedy tokens
with their log-probs, those after it are the new weights' (checked against transformers on each snapshot),
and the learner's importance ratio against the recorded behaviour log-probs is 1 after the seam and the
old/new policy ratio before it. The tokens after the seam also hold vLLM's in-place reload on CPU to the
new weights (without weight sync's `refresh_cpu_gemm` the LM head kept the start-up weights)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest
import pytest_asyncio

from searchr1.core.schemas import Task, Trajectory, TrajectoryGroup
from searchr1.rollout.agent import AgentLimits, Sampling, run_trajectory
from searchr1.rollout.engine import HfCodec
from searchr1.rollout.partial import InterruptibleGenerator
from searchr1.rollout.settings import AgentSettings, EngineSettings
from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator
from tests.support.tiny_lm import build_tiny_lm, perturb_weights

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = list(range(5, 25))
TURN_TOKENS = 300
SEAM_AFTER = 40
"""The push is announced once the turn has streamed this many tokens."""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("partial")
    base = build_tiny_lm(root / "base")
    return base, perturb_weights(base, root / "v1", scale=0.3)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(models):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    gen = await VllmGenerator.start(VllmEngineConfig(
        model=str(models[0]), engine=EngineSettings(gpu_memory_utilization=0.05, max_model_len=1024,
                                                    dtype="float32", max_num_seqs=8)))
    yield gen
    await gen.close()


def _tap(gen: VllmGenerator, after: int) -> asyncio.Event:
    """An event set once a request on `gen`'s vLLM engine has streamed `after` tokens (the real stream,
    passed through unchanged)."""
    reached = asyncio.Event()
    original = gen.engine.generate

    async def generate(*args, **kwargs):
        async with contextlib.aclosing(original(*args, **kwargs)) as stream:
            async for out in stream:
                if len(out.outputs[0].token_ids) >= after:
                    reached.set()
                yield out

    gen.engine.generate = generate
    return reached


def _hf_logprobs(model_dir, ids: list[int]):
    """transformers' log-prob of each next token of `ids` and its argmax, under the snapshot at `model_dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1)
    targets = torch.tensor(ids[1:])
    return logp.gather(-1, targets[:, None])[:, 0].tolist(), logits.argmax(-1).tolist()


async def _turn(gen, codec) -> object:
    async def no_search(query: str):
        return []

    limits = AgentLimits.from_settings(AgentSettings(max_turns=0, max_tokens_per_turn=TURN_TOKENS, max_response_tokens=TURN_TOKENS))
    return await run_trajectory(PROMPT, gen, codec, no_search, limits, Sampling.from_settings(AgentSettings(), temperature=0.0), "long")


async def test_a_push_mid_turn_gives_two_segments_with_each_side_s_log_probs(engine, models):
    import torch

    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.train.model import forward_logprobs

    base, v1 = models
    codec = HfCodec(engine.tokenizer())
    reference = await _turn(InterruptibleGenerator(engine, 0), codec)  # the base weights, uninterrupted
    assert reference.segments() == [(0, len(reference.response_ids), 0)]
    assert len(reference.response_ids) > 2 * SEAM_AFTER, "the greedy turn ends too early to push inside it"

    gen = InterruptibleGenerator(engine, 0)
    reached = _tap(engine, SEAM_AFTER)
    run = asyncio.create_task(_turn(gen, codec))
    await reached.wait()
    await gen.swap(lambda: engine.reload(str(v1)), lambda: 1)
    res = await run
    del engine.engine.generate  # untap

    (s0, e0, v0), (s1, e1, v1_) = res.segments()
    seam = e0
    assert (s0, v0, s1, v1_, e1) == (0, 0, seam, 1, len(res.response_ids)) and seam >= SEAM_AFTER
    assert gen.interruptions == 1 and res.num_turns == 1
    assert res.loss_mask == [1] * len(res.response_ids)
    # before the seam: the base weights' greedy tokens and log-probs
    assert res.response_ids[:seam] == reference.response_ids[:seam]
    assert res.behavior_logprobs[:seam] == pytest.approx(reference.behavior_logprobs[:seam], abs=1e-5)
    full = PROMPT + res.response_ids
    p = len(PROMPT)
    base_lp, _ = _hf_logprobs(base, full)
    new_lp, new_argmax = _hf_logprobs(v1, full)
    assert res.behavior_logprobs[:seam] == pytest.approx(base_lp[p - 1:p - 1 + seam], abs=1e-3)
    # after it: the new weights' greedy tokens, with the new weights' log-probs
    assert res.response_ids[seam:] == new_argmax[p - 1 + seam:]
    assert res.behavior_logprobs[seam:] == pytest.approx(new_lp[p - 1 + seam:], abs=1e-3)
    assert res.behavior_logprobs[seam:] != pytest.approx(base_lp[p - 1 + seam:], abs=1e-3)

    # the learner at version 1: its ratio π_θ/μ uses each token's own behaviour log-prob
    traj = Trajectory(prompt_ids=PROMPT, response_ids=res.response_ids, loss_mask=res.loss_mask,
                      behavior_logprobs=res.behavior_logprobs, segments=res.segments())
    group = TrajectoryGroup(task=Task(task_id="t", question="q", group_size=1), policy_version=0,
                            sampling_temperature=0.0, worker_id="w", trajectories=[traj])
    batch = build_batch([group])
    assert batch.policy_version.tolist() == [0]  # the row is as old as its oldest segment
    from transformers import AutoModelForCausalLM

    learner = AutoModelForCausalLM.from_pretrained(v1, dtype=torch.float32).eval()
    with torch.no_grad():
        logp, _ = forward_logprobs(learner, batch.input_ids, batch.attention_mask, mask=batch.loss_mask)
    ratio = torch.exp(logp - batch.behavior_logprobs)[0, p - 1:p - 1 + len(res.response_ids)]
    assert ratio[seam:].tolist() == pytest.approx([1.0] * (len(res.response_ids) - seam), abs=1e-3)
    expected_before = torch.exp(torch.tensor(new_lp[p - 1:p - 1 + seam]) - torch.tensor(base_lp[p - 1:p - 1 + seam]))
    assert ratio[:seam].tolist() == pytest.approx(expected_before.tolist(), rel=1e-3)
    assert not torch.allclose(ratio[:seam], torch.ones(seam), atol=1e-2)
