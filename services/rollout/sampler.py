"""One task's group, sampled and scored: the prompt rendered once, G trajectories run concurrently through
the agent loop (`agent.run_trajectory`) over one engine, the reward service's scores, and the
`TrajectoryGroup` that carries them, tagged with the policy version that generated all of it (the oldest
token's, for a group that spans a partial-rollout swap).

Sampling: a task's `SamplingParams` field that is set is used as is; one left unset (None) takes the
worker's `agent` setting. Every group records the temperature it was actually sampled at
(`TrajectoryGroup.sampling_temperature`), which the learner checks against the one it trains at.

No streams, no weights: the worker (`worker.py`) reads tasks, publishes and acks; `rollout once`,
benchmarks and tests call `GroupSampler` directly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from searchr1.core.protocol import render_prompt
from searchr1.core.schemas import Task, Trajectory, TrajectoryGroup
from searchr1.rollout.agent import AgentLimits, Sampling, SearchFn, TrajectoryResult, run_trajectory
from searchr1.rollout.engine import Generator, TextCodec
from searchr1.rollout.metrics import RolloutMetrics, StagedGenerator, staged_search
from searchr1.rollout.settings import AgentSettings, RewardClientSettings


class ScoreResultLike(Protocol):
    scores: list[float]
    components: list[dict[str, float]]


class Scorer(Protocol):
    """`RewardClient.score` has this signature."""

    async def score(self, scorer: str, items: Sequence[Any], params: dict | None = None) -> ScoreResultLike: ...


def sampling_for(task: Task, agent: AgentSettings) -> Sampling:
    """The task's sampling params, with the worker's settings where the task leaves one unset (None)."""
    s = task.sampling
    return Sampling.from_settings(agent, seed=s.seed, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)


def limits_for(task: Task, agent: AgentSettings, max_context_tokens: int | None = None) -> AgentLimits:
    """The task's per-turn budget when it sets one, the worker's otherwise; the other limits are the
    worker's."""
    return AgentLimits.from_settings(agent, max_context_tokens=max_context_tokens,
                                     max_tokens_per_turn=task.sampling.max_tokens_per_turn)


def score_items(task: Task, prompt_text: str, responses: Sequence[str], searches: Sequence[int],
                item_format: str) -> list[dict[str, Any]]:
    """Reward-service items for a group: Search-R1's `solution_str` (prompt + response, special tokens
    kept) with `ground_truth.target`, or our `{prompt, response, golden_answers, num_searches}`."""
    if item_format == "solution_str":
        return [{"solution_str": prompt_text + r, "ground_truth": {"target": list(task.golden_answers)}}
                for r in responses]
    return [{"prompt": prompt_text, "response": r, "golden_answers": list(task.golden_answers),
             "num_searches": n} for r, n in zip(responses, searches)]


@dataclass
class GroupSampler:
    """Samples and scores the G trajectories of one task (no streams: usable from `rollout once`,
    benchmarks and tests)."""

    generator: Generator
    codec: TextCodec
    tokenizer: Any
    search: SearchFn
    scorer: Scorer | None
    agent: AgentSettings
    reward: RewardClientSettings
    metrics: RolloutMetrics
    max_context_tokens: int | None = None
    """The engine's context length; turns never ask for more (a longer trajectory ends with `length`)."""

    def prompt_ids(self, task: Task) -> tuple[str, list[int]]:
        text = render_prompt(task.question, self.tokenizer, self.agent.template)
        return text, self.codec.encode(text)

    async def rollout(self, task: Task, request_prefix: str,
                      base: Sampling | None = None) -> tuple[str, list[TrajectoryResult]]:
        """The task's G trajectories, sampled with `base` (default: `sampling_for` the task)."""
        prompt_text, prompt_ids = self.prompt_ids(task)
        base = base or sampling_for(task, self.agent)
        limits = limits_for(task, self.agent, self.max_context_tokens)
        runs: list[asyncio.Task[TrajectoryResult]] = []
        generator, search = StagedGenerator(self.generator, self.metrics.stages), staged_search(
            self.search, self.metrics.stages)  # the worker's stage clock (metrics.STAGES)
        # a TaskGroup: if one trajectory fails (engine error), its siblings are cancelled (their vLLM
        # requests aborted) instead of running on for a group that will not be published
        async with asyncio.TaskGroup() as tg:
            for i in range(task.group_size):
                seed = None if base.seed is None else base.seed + 1_000_003 * i
                sampling = Sampling(base.temperature, base.top_p, base.top_k, seed, base.extra_args)
                runs.append(tg.create_task(run_trajectory(prompt_ids, generator, self.codec, search,
                                                          limits, sampling, f"{request_prefix}-g{i}")))
        return prompt_text, [r.result() for r in runs]

    async def sample_group(self, task: Task, policy_version: int, worker_id: str,
                           request_prefix: str) -> TrajectoryGroup:
        t0 = time.perf_counter()
        sampling = sampling_for(task, self.agent)
        prompt_text, results = await self.rollout(task, request_prefix, sampling)
        t_gen = time.perf_counter()
        responses = [self.codec.decode(r.response_ids) for r in results]
        scores: list[float] = [0.0] * len(results)
        components: list[dict[str, float]] = [{} for _ in results]
        if self.scorer is not None:
            items = score_items(task, prompt_text, responses, [r.num_searches for r in results],
                                self.reward.item_format)
            with self.metrics.stages.stage("scoring"):
                scored = await self.scorer.score(self.reward.scorer, items, self.reward.params or None)
            scores, components = list(scored.scores), [dict(c) for c in scored.components]
        t_score = time.perf_counter()
        trajectories = [
            Trajectory(
                prompt_ids=r.prompt_ids, response_ids=r.response_ids, loss_mask=r.loss_mask,
                behavior_logprobs=r.behavior_logprobs, reward=float(s), reward_components=c,
                num_turns=r.num_turns, num_searches=r.num_searches, finish_reason=r.finish_reason,
                response_text=text, segments=r.segments(),
            )
            for r, s, c, text in zip(results, scores, components, responses)
        ]
        m = self.metrics
        for r, s in zip(results, scores):
            m.tokens_generated.inc(r.generated_tokens)
            m.env_tokens.inc(r.env_tokens)
            m.trajectories.labels(r.finish_reason).inc()
            m.turns.observe(r.num_turns)
            m.searches.observe(r.num_searches)
            m.obs_truncations.inc(r.obs_truncations)
            m.reward.observe(s)
        if scores:
            m.reward_mean.set(sum(scores) / len(scores))
        # interrupted trajectories (partial rollouts) span versions: the group is as old as its oldest token
        policy_version = min((v for t in trajectories for _, _, v in t.segments), default=policy_version)
        return TrajectoryGroup(
            task=task, policy_version=policy_version, sampling_temperature=sampling.temperature,
            worker_id=worker_id, trajectories=trajectories,
            timings={"rollout": t_gen - t0, "score": t_score - t_gen,
                     "generate_mean": sum(r.generate_seconds for r in results) / len(results),
                     "search_mean": sum(r.search_seconds for r in results) / len(results)},
        )
