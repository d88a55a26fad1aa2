"""A real pretrained LM through the system on CPU: SmolLM2-135M-Instruct (prepared once per machine by
`searchr1 models prepare`, ~20 s) served by vLLM's CPU build, a rollout group with a real search (BM25
over gRPC), one GRPO step of the learner on the real Llama weights, the snapshot published and reloaded
by the engine in place, and the train–inference mismatch measured on fresh samples of the reloaded engine:
the learner's log-prob of each sampled id under the same weights against the engine's.

The 135M instruct model does not know Search-R1's protocol, so the group's prompt ends with a fixed
assistant prefix that opens a search (`<think> … </think>\\n<search>`), as a warm start would have taught
it; the model writes the query and closes the tag itself (or not: then the turn runs out). Prints one
`REAL_MODEL_SMOKE {json}` line with the step's time split and the mismatch figures (run with -s).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from searchr1.core.protocol import normalize_answer, render_prompt
from searchr1.core.schemas import Task, Trajectory, TrajectoryGroup
from searchr1.rollout.agent import AgentLimits, Sampling, run_trajectory
from searchr1.rollout.engine import HfCodec, TurnRequest
from searchr1.rollout.settings import AgentSettings
from tests.support.real_models import prepared
from tests.support.rollout_stack import start_retriever, start_vllm

PREFIX = "<think> I need to search for this. </think>\n<search>"
QUESTION, GOLD = "what is the capital of france", "Paris"
GROUP, SAMPLES = 6, 8
MEAN_GAP_BOUND = 5e-4
"""Bound on the mean |log π_learner − log π_engine| per sampled token (fp32 on both sides). Measured on
2 cores: 9e-6 after an in-place reload; an engine whose LM head kept its start-up weights after the
reload (vLLM CPU's packed GEMM not re-packed) showed 1.75e-3, so the bound tells the two apart."""


class Recording:
    """The engine, recording what it returned (to check the trained ids against)."""

    def __init__(self, gen):
        self.gen, self.returned = gen, []

    async def generate(self, request, request_id):
        out = await self.gen.generate(request, request_id)
        self.returned.append(out.token_ids)
        return out


async def _group(gen, codec, tok, retriever):
    from searchr1.core.clients.retriever import RetrieverClient

    prompt_ids = codec.encode(render_prompt(QUESTION, tok) + PREFIX)
    limits = AgentLimits.from_settings(AgentSettings(max_turns=2, max_tokens_per_turn=40, max_obs_tokens=160, max_response_tokens=400))
    async with RetrieverClient([retriever.address]) as client:
        async def search(q):
            return (await client.search([q], top_k=2))[0]

        rec = [Recording(gen) for _ in range(GROUP)]
        results = [await run_trajectory(prompt_ids, rec[i], codec, search, limits, Sampling.from_settings(AgentSettings(), seed=100 + i),
                                        request_id=f"g{i}", opened=PREFIX) for i in range(GROUP)]
    return prompt_ids, results, rec


def _trajectory(prompt_ids, r, reward):
    return Trajectory(prompt_ids=prompt_ids, response_ids=r.response_ids, loss_mask=r.loss_mask,
                      behavior_logprobs=r.behavior_logprobs, reward=reward, num_turns=r.num_turns,
                      num_searches=r.num_searches, finish_reason=r.finish_reason)


def _batch_of(prompt_ids, trajs):
    from searchr1.learner.algo.batch import build_batch

    group = TrajectoryGroup(task=Task(task_id="q", question=QUESTION, golden_answers=[GOLD], group_size=len(trajs)),
                            policy_version=0, sampling_temperature=1.0, worker_id="w", trajectories=trajs)
    return build_batch([group], pad_id=2)


def _learner_logprobs(policy, batch):
    from searchr1.learner.train.model import forward_logprobs

    with torch.no_grad():
        return forward_logprobs(policy, batch.input_ids, batch.attention_mask, mask=batch.loss_mask)[0]


@pytest.mark.release  # minutes (the model's preparation, vLLM's start, a learner step): make test-release
@pytest.mark.timeout(1500)
async def test_real_model_rollout_step_reload_and_logprob_gap(tmp_path):
    from searchr1.learner.algo.tis import mismatch_figures
    from searchr1.learner.settings import LearnerSettings
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.model import DistInfo, export_weights
    from searchr1.weightsync import WeightPublisher

    model = prepared("smollm2-135m")
    figures: dict[str, float] = {}
    t = time.perf_counter()
    gen = await start_vllm(model, max_num_seqs=16)
    figures["engine_start_s"] = time.perf_counter() - t
    retriever = None
    try:
        (tmp_path / "retriever").mkdir()
        retriever = await start_retriever(tmp_path / "retriever")
        tok = gen.tokenizer()
        codec = HfCodec(tok)
        t = time.perf_counter()
        prompt_ids, results, rec = await _group(gen, codec, tok, retriever)
        figures["generation_s"] = time.perf_counter() - t
        # what is trained is what the engine sampled plus the observations, with exact masks
        for r, g in zip(results, rec):
            assert [i for i, m in zip(r.response_ids, r.loss_mask) if m] == [i for ids in g.returned for i in ids]
            env = codec.decode([i for i, m in zip(r.response_ids, r.loss_mask) if not m])
            assert env.count("\n\n<information>") == r.num_searches
        assert sum(r.num_searches for r in results) >= 1, [codec.decode(r.response_ids) for r in results]
        # the smoke's reward: a search and a right answer each score (the mechanics, not the task, are tested)
        rewards = [float(r.num_searches > 0) + float(normalize_answer(r.answer or "") == normalize_answer(GOLD))
                   for r in results]
        batch = _batch_of(prompt_ids, [_trajectory(prompt_ids, r, w) for r, w in zip(results, rewards)])

        settings = LearnerSettings(
            model={"path": str(model)}, device="cpu", threads=2, seed=0,
            algorithm={"advantage": "grpo", "use_kl_loss": False, "entropy_coef": 0.001, "tis_cap": 2.0},
            optim={"lr": 1e-5, "weight_decay": 0.0}, batch={"micro_batch_size": 2})
        training = build_training(settings, DistInfo())
        policy = training.trainer.policy
        before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        t = time.perf_counter()
        stats = training.trainer.train_step(batch, version=0)
        figures["learner_step_s"] = time.perf_counter() - t
        assert all(v == v for v in stats.values()), stats  # no NaN
        # the first group's own gap (engine sampled under the weights the learner started from)
        figures["tis_weight_mean"] = stats["is_weight_mean"]

        t = time.perf_counter()
        hf_model, state = export_weights(policy, DistInfo())
        snap = WeightPublisher(tmp_path / "weights", keep=3).write(1, hf_model, state)
        figures["snapshot_write_s"] = time.perf_counter() - t
        t = time.perf_counter()
        await gen.reload(str(snap))
        figures["engine_reload_s"] = time.perf_counter() - t

        # fresh samples from the reloaded engine, scored by the learner under the same weights
        plain_ids = codec.encode(render_prompt(QUESTION, tok))
        outs = [await gen.generate(TurnRequest(prompt_ids=plain_ids, max_tokens=48, temperature=1.0, top_p=1.0,
                                               top_k=-1, seed=500 + i), f"m{i}")
                for i in range(SAMPLES)]
        trajs = [Trajectory(prompt_ids=plain_ids, response_ids=o.token_ids, loss_mask=[1] * len(o.token_ids),
                            behavior_logprobs=o.logprobs) for o in outs]
        mb = _batch_of(plain_ids, trajs)
        gap = mismatch_figures(_learner_logprobs(policy, mb), mb.behavior_logprobs, mb.loss_mask)
        policy.load_state_dict(before)
        stale_gap = mismatch_figures(_learner_logprobs(policy, mb), mb.behavior_logprobs, mb.loss_mask)
        figures.update({f"gap_{k}": v for k, v in gap.__dict__.items()})
        figures["gap_vs_pre_step_weights_mean"] = stale_gap.mean_abs_diff
        print("REAL_MODEL_SMOKE " + json.dumps({k: round(v, 6) if isinstance(v, float) else v
                                                for k, v in figures.items()}))
        assert gap.tokens >= SAMPLES
        assert gap.mean_abs_diff < MEAN_GAP_BOUND
        assert 0.99 < gap.ratio_p01 <= gap.ratio_p50 <= gap.ratio_p99 < 1.01
        # the engine serves the learner's new weights, not the old ones: the step's change is far larger
        assert stale_gap.mean_abs_diff > 3 * gap.mean_abs_diff
    finally:
        if retriever is not None:
            await retriever.stop()
        await gen.close()
