"""The agent loop held against plain generation (the limit row of `benchmarks/rollout.py`).

Both sides run on the same vLLM engine (same engine arguments, same steering logits processor, same
concurrency), in the same run:

- *agent loop*: `run_trajectory` for every trajectory at once — a turn stops at `</search>`/`</answer>`,
  retrieval answers at once (fixed hits, no retriever, no batcher: zero latency), the observation is
  appended and generation resumes from the whole context as a new request;
- *plain generation*: one request per trajectory from the same prompt, submitted all at once, asked for
  exactly as many tokens as that trajectory generated in the agent loop (`min_tokens = max_tokens`,
  `ignore_eos`, no stop strings) — vLLM's own continuous batching over the same number of tokens, with
  no turn boundaries.

The ratio (agent loop generated tokens/s over plain tokens/s) is the share of the engine's throughput
the agent loop keeps. What the agent loop pays on top: each turn is a new request (scheduling, a prefill
of the context, of which the prefix cache serves everything but the observation and the last partial
block), the observation's own prefill, and this process's Python per turn (encode, parse, asyncio).
Both sides print the prompt tokens the engine computed (`PrefillCounter`: prompt length minus prefix-cache
hits, per request), which separates the prefill cost from the rest.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class _Hit:
    contents: str


_HITS = [_Hit('"Paris"\nParis is the capital and most populous city of France.'),
         _Hit('"Berlin"\nBerlin is the capital and largest city of Germany.'),
         _Hit('"Rome"\nRome is the capital city of Italy.')]


async def instant_search(query: str) -> list[_Hit]:
    """Retrieval with zero latency: three fixed passages, whatever the query."""
    return _HITS


class PrefillCounter:
    """Wraps an `AsyncLLM`: counts, per finished request, the prompt tokens the engine computed (prompt
    length minus the tokens its prefix cache served). Everything else is delegated."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.computed = 0
        self.prompt = 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt, params, request_id):
        last = None
        async for out in self.engine.generate(prompt, params, request_id):
            last = out
            yield out
        if last is not None:
            n = len(prompt["prompt_token_ids"])
            self.prompt += n
            self.computed += n - (last.num_cached_tokens or 0)


@dataclass(frozen=True, slots=True)
class LimitFigures:
    agent_seconds: float
    agent_tokens: int
    agent_turns: int
    env_tokens: int
    plain_seconds: float
    plain_tokens: int
    agent_prefill: int = 0
    plain_prefill: int = 0

    @property
    def ratio(self) -> float:
        return (self.agent_tokens / self.agent_seconds) / (self.plain_tokens / self.plain_seconds)

    def lines(self) -> str:
        return (f"{'agent loop (0-lat. search)':<28} {self.agent_seconds:7.2f} s  "
                f"{self.agent_tokens / self.agent_seconds:8.0f} gen tok/s  {self.agent_tokens:7d} tokens  "
                f"{self.agent_turns:5d} turns  {self.env_tokens:7d} observation tokens  "
                f"{self.agent_prefill:7d} prompt tokens computed\n"
                f"{'plain vLLM generation':<28} {self.plain_seconds:7.2f} s  "
                f"{self.plain_tokens / self.plain_seconds:8.0f} gen tok/s  {self.plain_tokens:7d} tokens  "
                f"{self.plain_prefill:7d} prompt tokens computed (same engine, same tokens per trajectory, no turns)\n"
                f"  agent loop / plain generation: {100 * self.ratio:.1f}% of the engine's tokens/s")


async def agent_loop(gen, codec, prompts, args, extra):
    """Every trajectory through `run_trajectory` at once, with zero-latency search."""
    from searchr1.rollout.agent import AgentLimits, Sampling, run_trajectory

    limits = AgentLimits(max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn,
                         max_obs_tokens=500, max_response_tokens=8192)
    t0 = time.perf_counter()
    results = await asyncio.gather(*[
        run_trajectory(p, gen, codec, instant_search, limits, Sampling(seed=seed, extra_args=extra), f"lim-{seed}")
        for seed, p in prompts])
    return time.perf_counter() - t0, results


async def plain_generation(gen, prompts, counts, extra, tag: str) -> tuple[float, int]:
    """One request per prompt for exactly `counts[i]` tokens, all submitted at once, straight on the engine."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    async def one(i: int, seed: int, ids: list[int], n: int) -> int:
        params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, seed=seed, logprobs=0,
                                extra_args=extra)
        final = None
        async for out in gen.engine.generate(TokensPrompt(prompt_token_ids=list(ids)), params, f"{tag}-{i}"):
            final = out
        return len(final.outputs[0].token_ids)

    t0 = time.perf_counter()
    got = await asyncio.gather(*[one(i, seed, ids, n) for i, ((seed, ids), n) in enumerate(zip(prompts, counts))
                                 if n > 0])
    return time.perf_counter() - t0, sum(got)


async def limit_row(gen, codec, prompts, args, extra) -> LimitFigures:
    """The agent loop, then plain generation of the same per-trajectory token counts, on one engine."""
    engine = gen.engine
    try:
        gen.engine = agent_count = PrefillCounter(engine)
        await engine.reset_prefix_cache()
        agent_s, results = await agent_loop(gen, codec, prompts, args, extra)
        counts = [r.generated_tokens for r in results]
        gen.engine = plain_count = PrefillCounter(engine)
        await engine.reset_prefix_cache()
        plain_s, plain_n = await plain_generation(gen, prompts, counts, extra, f"plain-{time.monotonic_ns()}")
    finally:
        gen.engine = engine
    return LimitFigures(agent_s, sum(counts), sum(r.num_turns for r in results), sum(r.env_tokens for r in results),
                        plain_s, plain_n, agent_count.computed, plain_count.computed)
