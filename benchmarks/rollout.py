"""Rollout throughput: our per-trajectory async agent loop vs Search-R1's turn-synchronous loop, on the
same vLLM engine and the same retriever, in the same run.

    .venv/bin/python benchmarks/rollout.py [--tasks 64] [--group 5] [--max-turns 4] [--latency-ms 50]
                                           [--max-tokens-per-turn 128] [--repeats 1]

- (a) ours: every trajectory is its own asyncio task (`searchr1.rollout.agent.run_trajectory`): a turn
  stops at `</search>`/`</answer>` (vLLM stop strings), searches from all trajectories are micro-batched
  into one retriever call (`SearchBatcher`), and a trajectory waiting on search never blocks the others.
- (b) baseline, Search-R1's pattern (`search_r1/llm_agent/generation.py`): per turn, ALL active
  trajectories generate to `max_tokens` (no stop strings), each turn's output is cut after the first
  `</search>`/`</answer>` (the rest is discarded), then ALL searches go out as one call, then the next
  turn; after `max_turns` one final turn without search.
- (c) the same turn-synchronous loop but with our stop strings (separates the two effects).

The agent loop against its floor (plain vLLM generation of the same tokens with the observations in the
prompt) is `benchmarks/rollout_limit.py`.

All three use the same model (a tiny random Qwen2 built here, or --model), the same retriever (BM25 over a
small corpus, real gRPC server) with `--latency-ms` added to every retriever call, the same seeds and
the same steering: the random model is driven into the Search-R1 structure by the `SearchSteering`
vLLM logits processor (think → search with p=0.7 while < max_turns searches → answer; query words drawn
from the vocabulary's word pieces), so the policy really searches.

Prints trajectories/s, generated tokens/s (all sampled tokens) and kept tokens/s, searches per
trajectory and the share of generated tokens that were discarded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Figures:
    name: str
    seconds: float
    trajectories: int
    generated: int
    kept: int
    searches: int
    retriever_calls: int

    def line(self) -> str:
        disc = 1 - self.kept / self.generated if self.generated else 0.0
        return (f"{self.name:<22} {self.seconds:7.2f} s  {self.trajectories / self.seconds:7.2f} traj/s  "
                f"{self.generated / self.seconds:8.0f} gen tok/s  {self.kept / self.seconds:8.0f} kept tok/s  "
                f"{self.searches / self.trajectories:5.2f} searches/traj  {self.retriever_calls:4d} retriever calls  "
                f"discarded {100 * disc:5.1f}%")


class DelayedBackend:
    """The real retriever client plus a fixed added latency per call (network / a bigger index)."""

    def __init__(self, client, latency_s: float) -> None:
        self.client = client
        self.latency_s = latency_s
        self.calls = 0

    async def search(self, queries, top_k=3):
        self.calls += 1
        await asyncio.sleep(self.latency_s)
        return await self.client.search(queries, top_k)


async def ours(gen, codec, prompts, backend, args, extra) -> Figures:
    from searchr1.rollout.agent import AgentLimits, Sampling, run_trajectory
    from searchr1.rollout.batcher import SearchBatcher
    from searchr1.rollout.settings import AgentSettings, RetrieverClientSettings

    batcher = SearchBatcher(backend, RetrieverClientSettings(top_k=3, max_batch=512, max_wait_ms=2))
    agent = AgentSettings(max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn, max_obs_tokens=500,
                          max_response_tokens=8192, extra_args=extra)
    limits = AgentLimits.from_settings(agent)
    calls0 = backend.calls
    t0 = time.perf_counter()
    results = await asyncio.gather(*[
        run_trajectory(p, gen, codec, batcher.search, limits, Sampling.from_settings(agent, seed=seed), f"ours-{seed}")
        for seed, p in prompts])
    dt = time.perf_counter() - t0
    generated = sum(r.generated_tokens for r in results)
    errors = sum(r.finish_reason == "error" for r in results)
    if errors:
        print(f"  warning: {errors} trajectories ended in error (retriever failures)")
    return Figures("ours (async, stop)", dt, len(results), generated, generated, sum(r.num_searches for r in results),
                   backend.calls - calls0)


async def turn_synchronous(gen, codec, tokenizer, prompts, backend, args, extra, *, stop: bool = False) -> Figures:
    """Search-R1's loop: generate all → cut → search all → repeat; final turn without search.
    `stop=True` adds our stop strings to it (isolates the gain of not waiting turn by turn)."""
    from searchr1.core.protocol import INVALID_ACTION_MESSAGE, STOP_STRINGS, observation_for, parse_action
    from searchr1.rollout.engine import TurnRequest

    tag_ids = {tokenizer.convert_tokens_to_ids("</search>"), tokenizer.convert_tokens_to_ids("</answer>")}
    state = [{"seed": seed, "ids": list(p), "n_prompt": len(p), "active": True, "searches": 0} for seed, p in prompts]
    generated = kept = 0
    calls0 = backend.calls
    t0 = time.perf_counter()
    for turn in range(args.max_turns + 1):
        do_search = turn < args.max_turns
        active = [s for s in state if s["active"]]
        if not active:
            break
        outs = await asyncio.gather(*[
            gen.generate(TurnRequest(prompt_ids=s["ids"], max_tokens=args.max_tokens_per_turn,
                                     temperature=1.0, top_p=1.0, top_k=-1, seed=s["seed"] + 7919 * turn, stop=STOP_STRINGS if stop else (),
                                     extra_args=extra),
                         f"sync-{s['seed']}-t{turn}")
            for s in active])
        queries, waiting = [], []
        for s, out in zip(active, outs):
            ids = out.token_ids
            cut = next((i + 1 for i, x in enumerate(ids) if x in tag_ids), len(ids))
            generated += len(ids)
            kept += cut
            ids = ids[:cut]
            s["ids"] += ids
            action = parse_action(codec.decode(ids))
            if action.kind == "answer" or out.finish == "eos":
                s["active"] = False
            elif action.kind == "search":
                if do_search:
                    queries.append(action.content)
                    waiting.append(s)
                else:
                    s["active"] = False
            elif do_search:
                s["ids"] += codec.encode(INVALID_ACTION_MESSAGE)
            else:
                s["active"] = False
        if queries:
            results = await backend.search(queries, 3)
            for s, hits in zip(waiting, results):
                s["searches"] += 1
                s["ids"] += codec.encode(observation_for([h.contents for h in hits]))[:500]
    dt = time.perf_counter() - t0
    return Figures("turn-sync + stop" if stop else "turn-synchronous", dt, len(state), generated, kept, sum(s["searches"] for s in state),
                   backend.calls - calls0)


async def run(args) -> None:
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from searchr1.core.clients.retriever import RetrieverClient
    from searchr1.core.protocol import render_prompt
    from searchr1.rollout.engine import HfCodec
    from searchr1.rollout.tools.steering import steer_args, word_tokens
    from tests.support.rollout_stack import QUESTIONS, start_retriever, start_vllm
    from tests.support.tiny_lm import build_tiny_lm

    work = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    model = Path(args.model) if args.model else build_tiny_lm(work / "model")
    tokenizer = AutoTokenizer.from_pretrained(model)
    codec = HfCodec(tokenizer)
    print(f"model {model}; starting vLLM (CPU) and the BM25 retriever …", flush=True)
    gen = await start_vllm(model, max_num_seqs=args.max_num_seqs)
    retriever = await start_retriever(work)
    client = RetrieverClient([retriever.address])
    backend = DelayedBackend(client, args.latency_ms / 1000)
    extra = steer_args(tokenizer, p_search=0.7, max_searches=args.max_turns, search_tokens=word_tokens(tokenizer))
    prompts = []
    for t in range(args.tasks):
        q, _ = QUESTIONS[t % len(QUESTIONS)]
        ids = codec.encode(render_prompt(f"{q} (variant {t})", tokenizer))
        prompts += [(1000 * t + g, ids) for g in range(args.group)]
    try:
        # warm-up (first requests pay one-off costs) on a few prompts, not measured
        await ours(gen, codec, prompts[:8], backend, args, extra)
        await turn_synchronous(gen, codec, tokenizer, prompts[:8], backend, args, extra)
        print(f"\n{args.tasks} tasks x G={args.group} = {len(prompts)} trajectories, max_turns={args.max_turns}, "
              f"max_tokens_per_turn={args.max_tokens_per_turn}, +{args.latency_ms:.0f} ms per retriever call, "
              f"vLLM CPU (engine threads: vLLM default, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
              f"retriever BM25 torch/faiss threads 1\n")
        for _rep in range(args.repeats):
            a = await ours(gen, codec, prompts, backend, args, extra)
            b = await turn_synchronous(gen, codec, tokenizer, prompts, backend, args, extra)
            c = await turn_synchronous(gen, codec, tokenizer, prompts, backend, args, extra, stop=True)
            for f in (a, b, c):
                print(f.line())
            print(f"  ours vs turn-synchronous (Search-R1): {b.seconds / a.seconds:.2f}x trajectories/s, "
                  f"{(a.kept / a.seconds) / (b.kept / b.seconds):.2f}x useful tokens/s; "
                  f"vs turn-sync + stop strings: {c.seconds / a.seconds:.2f}x; load average {_load()}\n", flush=True)
    finally:
        await client.close()
        await retriever.stop()
        await gen.close()


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=64)
    p.add_argument("--group", type=int, default=5)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--max-tokens-per-turn", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--model", default=None, help="Model directory (default: build the tiny random Qwen2).")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
