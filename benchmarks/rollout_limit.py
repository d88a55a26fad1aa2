"""The agent loop against its floor: plain vLLM generation of the same sampled tokens with each trajectory's
observations already in its prompt, paired run by run on one engine.

    .venv/bin/python benchmarks/rollout_limit.py [--runs 5] [--trajectories 640] [--max-turns 4]
                                                 [--max-tokens-per-turn 128] [--block-size N] [--world DIR]

Set-up: the tiny world (`searchr1 world build`; the small test configuration is built into a temporary
directory unless `--world` names a built one): its random initial model on one vLLM CPU engine with the
rollout worker's engine settings (`EngineSettings` defaults, float32, 2048-token context), its train and
test questions as prompts (cycled, each made unique by a number, one trajectory each), its corpus behind
the in-process BM25 (`searchr1.world.search.CorpusSearch`, three passages per search). The random model is
driven into the Search-R1 structure by the `SearchSteering` logits processor (think → search with p=0.7
while fewer than `--max-turns` searches → answer), so it really searches.

Each run is a pair, measured back to back on the same engine, its prefix cache emptied before each side:

- *agent loop*: `run_trajectory` for every trajectory at once, as the rollout worker runs it: a turn stops
  at `</search>`/`</answer>`, the search runs, its observation is appended (mask 0) and the next turn is a
  new request on the whole context (the prefix cache serves the blocks already computed).
- *floor*: one plain request per trajectory, all submitted at once, whose prompt is the trajectory's
  prompt followed by all of its environment tokens (observations, invalid-action text) in order, asked
  for exactly as many tokens as the agent loop sampled for it (`max_tokens = min_tokens = n`,
  `ignore_eos`, no stop strings; same steering, same engine, same seeds). It pays what the task itself
  costs — the prompt's and the observations' prefill once, the same number of sampled tokens, continuous
  batching over the same number of sequences — and nothing a turn structure adds: no request per turn, no
  recomputation of context the engine had already computed, no search, no Python between turns.
  Prompts are unique per trajectory, so both sides share only the template's instruction through the
  prefix cache, and the floor's observations (which follow the prompt directly) never hit blocks another
  trajectory cached — something the agent loop, whose observations follow different sampled text,
  could never do.

The share is (agent sampled tokens / agent seconds) / (floor sampled tokens / floor seconds), per run.
A warm-up pair over every prompt runs first, unmeasured: one-off engine costs, and every query the seeded
runs issue enters the search's cache, so measured runs search at (nearly) zero latency (printed). Per side
the benchmark also prints the prompt tokens the engine computed (prompt length minus prefix-cache hits),
requests, engine steps, the tokens the engine sampled (kept or discarded) and CPU seconds of this process
and of the engine's processes, which locate the difference. On shared cores figures are provisional: the
load average is printed with every run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Hit:
    contents: str


class TimedSearch:
    """`CorpusSearch` behind the agent's async search signature; sums the seconds spent searching."""

    def __init__(self, corpus: list[str], top_k: int = 3) -> None:
        from searchr1.world.search import CorpusSearch

        self.index = CorpusSearch(corpus)
        self.top_k = top_k
        self.seconds = 0.0

    async def __call__(self, query: str) -> list[Hit]:
        t0 = time.perf_counter()
        rows = self.index.search(query, self.top_k)
        self.seconds += time.perf_counter() - t0
        return [Hit(c) for c in self.index.contents(rows)]


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) used so far by this process (the agent loop and vLLM's front end) and by
    its children (vLLM's engine core and its worker): figures that other jobs on shared cores move less
    than wall time."""
    import psutil

    def total(procs) -> float:
        times = []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                times.append(sum(p.cpu_times()[:2]))
        return sum(times)

    me = psutil.Process()
    return total([me]), total(me.children(recursive=True))


class StepCounter:
    """Counts what vLLM's engine core reports back: steps (messages carrying request outputs) and the
    tokens it sampled (kept or not: a request the engine core does not know to be finished goes on
    sampling until its abort arrives). Wraps the client's `get_output_async` on one engine: install it
    before the engine's first request (the output loop then awaits the wrapper)."""

    def __init__(self, engine) -> None:
        self.steps = 0
        self.sampled = 0
        client = engine.engine_core
        inner = client.get_output_async

        async def counted():
            outs = await inner()
            if outs.outputs:
                self.steps += 1
                self.sampled += sum(len(o.new_token_ids) for o in outs.outputs)
            return outs

        client.get_output_async = counted

    def snapshot(self) -> tuple[int, int]:
        return self.steps, self.sampled


class PrefillCounter:
    """Wraps an `AsyncLLM`: counts, per finished request, the prompt tokens the engine computed (prompt
    length minus the tokens its prefix cache served). Everything else is delegated."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.computed = 0
        self.requests = 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt, params, request_id, **kwargs):
        last = None
        async for out in self.engine.generate(prompt, params, request_id, **kwargs):
            last = out
            yield out
        if last is not None and isinstance(prompt, dict):
            n = len(prompt["prompt_token_ids"])
            self.requests += 1
            self.computed += n - (last.num_cached_tokens or 0)


@dataclass(frozen=True, slots=True)
class Side:
    """What one side of a paired run cost."""

    seconds: float
    tokens: int
    """Sampled tokens kept (the agent loop's trajectories; the floor's outputs)."""
    prefill: int
    """Prompt tokens the engine computed (prompt length minus prefix-cache hits, summed over requests)."""
    requests: int
    steps: int
    """Engine steps that produced request outputs."""
    engine_tokens: int
    """Tokens the engine sampled, kept or not."""
    cpu_front: float
    """CPU seconds of this process: the agent loop (or the floor's requests) and vLLM's front end."""
    cpu_engine: float
    """CPU seconds of vLLM's engine core and worker processes."""

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


@dataclass(frozen=True, slots=True)
class PairFigures:
    """One paired run: the agent loop, then its floor."""

    agent: Side
    floor: Side
    turns: int
    env_tokens: int
    search_seconds: float
    load: float
    """The 1-minute load average, mean of its values before and after the run."""

    @property
    def share(self) -> float:
        return self.agent.rate / self.floor.rate

    @property
    def cpu_share(self) -> float:
        """The same share over CPU seconds (both processes) instead of wall seconds."""
        return (self.floor.cpu_front + self.floor.cpu_engine) / (self.agent.cpu_front + self.agent.cpu_engine)


class Meter:
    """Measures one side on one engine: wall and CPU seconds, engine steps and sampled tokens, and (through
    the `PrefillCounter` it hands out as the engine) prompt tokens computed."""

    def __init__(self, engine, steps: StepCounter) -> None:
        self.counter = PrefillCounter(engine)
        self.steps = steps

    def __enter__(self) -> Meter:
        self.t0, self.c0, self.s0 = time.perf_counter(), cpu_seconds(), self.steps.snapshot()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.t0
        c1, s1 = cpu_seconds(), self.steps.snapshot()
        self.cpu = (c1[0] - self.c0[0], c1[1] - self.c0[1])
        self.delta = (s1[0] - self.s0[0], s1[1] - self.s0[1])

    def side(self, tokens: int) -> Side:
        return Side(self.seconds, tokens, self.counter.computed, self.counter.requests, self.delta[0],
                    self.delta[1], *self.cpu)


async def agent_side(gen, codec, prompts, search, args, extra, tag: str):
    """Every trajectory through `run_trajectory` at once; returns the results."""
    from searchr1.rollout.agent import AgentLimits, Sampling, run_trajectory
    from searchr1.rollout.settings import AgentSettings

    agent = AgentSettings(max_turns=args.max_turns, max_tokens_per_turn=args.max_tokens_per_turn, max_obs_tokens=500,
                          max_response_tokens=8192, extra_args=extra)
    limits = AgentLimits.from_settings(agent)
    return await asyncio.gather(*[
        run_trajectory(p, gen, codec, search, limits, Sampling.from_settings(agent, seed=seed), f"{tag}-{seed}")
        for seed, p in prompts])


def floor_requests(results) -> list[tuple[list[int], int]]:
    """Per trajectory: (its prompt followed by its environment tokens, the number of tokens it sampled)."""
    out = []
    for r in results:
        env = [t for t, m in zip(r.response_ids, r.loss_mask) if m == 0]
        out.append((list(r.prompt_ids) + env, r.generated_tokens))
    return out


async def floor_side(engine, requests, seeds, extra, tag: str) -> int:
    """One plain request per trajectory for exactly its token count, all at once; returns the tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    async def one(i: int, seed: int, ids: list[int], n: int) -> int:
        params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, seed=seed, logprobs=0,
                                extra_args=extra)
        final = None
        async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params, f"{tag}-{i}"):
            final = out
        return len(final.outputs[0].token_ids)

    got = await asyncio.gather(*[one(i, seed, ids, n) for i, (seed, (ids, n)) in enumerate(zip(seeds, requests))
                                 if n > 0])
    return sum(got)


async def paired_run(gen, steps: StepCounter, b: Bench, args, tag: str) -> PairFigures:
    """The agent loop, then its floor, on one engine (prefix cache emptied before each)."""
    engine = gen.engine
    load0 = os.getloadavg()[0]
    b.search.seconds = 0.0
    await engine.reset_prefix_cache()
    try:
        with Meter(engine, steps) as agent:
            gen.engine = agent.counter
            results = await agent_side(gen, b.codec, b.prompts, b.search, args, b.extra, f"{tag}-a")
    finally:
        gen.engine = engine
    await engine.reset_prefix_cache()
    with Meter(engine, steps) as floor:
        floor_n = await floor_side(floor.counter, floor_requests(results), [s for s, _ in b.prompts], b.extra,
                                   f"{tag}-f")
    return PairFigures(agent.side(sum(r.generated_tokens for r in results)), floor.side(floor_n),
                       sum(r.num_turns for r in results), sum(r.env_tokens for r in results), b.search.seconds,
                       (load0 + os.getloadavg()[0]) / 2)


def table(rows: list[PairFigures]) -> str:
    """Per run: agent and floor tokens/s, the share, the same share over CPU seconds, the load average;
    then median, min and max of each column."""
    head = f"{'run':>6} {'agent tok/s':>11} {'floor tok/s':>11} {'share':>7} {'CPU share':>9} {'load':>5}"
    lines = [head, "-" * len(head)]

    def line(name, agent, floor, share, cpu, load) -> str:
        return f"{name:>6} {agent:>11.0f} {floor:>11.0f} {100 * share:>6.1f}% {100 * cpu:>8.1f}% {load:>5.1f}"

    for i, r in enumerate(rows, 1):
        lines.append(line(i, r.agent.rate, r.floor.rate, r.share, r.cpu_share, r.load))
    lines.append("-" * len(head))
    for name, f in (("median", statistics.median), ("min", min), ("max", max)):
        lines.append(line(name, f(r.agent.rate for r in rows), f(r.floor.rate for r in rows),
                          f(r.share for r in rows), f(r.cpu_share for r in rows), f(r.load for r in rows)))
    return "\n".join(lines)


def detail(r: PairFigures) -> str:
    """One run's costs per side: seconds, prompt tokens computed, requests, engine steps, tokens the engine
    sampled (kept + discarded), CPU seconds (this process + the engine's)."""
    def one(name: str, s: Side) -> str:
        return (f"  {name:<6} {s.seconds:7.2f} s  {s.tokens:7d} tokens  {s.prefill:8d} prefill  {s.requests:6d} requests  "
                f"{s.steps:6d} steps  {s.engine_tokens:7d} sampled  CPU {s.cpu_front:5.1f} + {s.cpu_engine:5.1f} s")
    return "\n".join([one("agent", r.agent), one("floor", r.floor),
                      f"  {r.turns} turns, {r.env_tokens} environment tokens, search {r.search_seconds:.2f} s; "
                      f"share {100 * r.share:.1f}% (over CPU seconds {100 * r.cpu_share:.1f}%), load {r.load:.1f}"])


def world_dir(args, work: Path) -> Path:
    """The world to run on: `--world`, or the small test world built into `work`."""
    if args.world:
        return Path(args.world)
    from searchr1.core.settings import load_settings
    from searchr1.world.build import build_world
    from searchr1.world.settings import WorldSettings
    from tests.support.world import SMALL_WORLD_TOML

    cfg = work / "world.toml"
    cfg.write_text(SMALL_WORLD_TOML)
    build_world(load_settings(WorldSettings, cfg), work / "world", with_model=True)
    return work / "world"


def world_prompts(world: Path, codec, tokenizer, trajectories: int) -> list[tuple[int, list[int]]]:
    """(seed, prompt ids) for `trajectories` prompts over the world's questions (train then test, cycled),
    each made unique by a number (see the module docstring)."""
    import json

    from searchr1.core.protocol import render_prompt

    questions = [json.loads(line)["question"] for name in ("tasks-train.jsonl", "tasks-test.jsonl")
                 for line in (world / name).read_text().splitlines() if line.strip()]
    out = []
    for i in range(trajectories):
        q = questions[i % len(questions)].rstrip("?")
        out.append((i, codec.encode(render_prompt(f"{q} ({i})", tokenizer))))
    return out


async def start_engine(model: Path, args):
    from searchr1.rollout.settings import EngineSettings
    from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return await VllmGenerator.start(VllmEngineConfig(model=str(model), engine=EngineSettings(
        gpu_memory_utilization=0.05, max_model_len=2048, dtype="float32", max_num_seqs=args.max_num_seqs,
        block_size=args.block_size, logits_processors=["searchr1.rollout.tools.steering:SearchSteering"])))


@dataclass
class Bench:
    """Everything one paired run needs except the engine."""

    codec: object
    prompts: list[tuple[int, list[int]]]
    search: TimedSearch
    extra: dict
    model: Path


def setup(args, work: Path) -> Bench:
    import json

    from transformers import AutoTokenizer

    from searchr1.rollout.engine import HfCodec
    from searchr1.rollout.tools.steering import steer_args, word_tokens

    world = world_dir(args, work)
    model = world / "model-init"
    tokenizer = AutoTokenizer.from_pretrained(model)
    codec = HfCodec(tokenizer)
    corpus = [json.loads(line)["contents"] for line in (world / "corpus.jsonl").read_text().splitlines() if line]
    extra = steer_args(tokenizer, p_search=0.7, max_searches=args.max_turns, search_tokens=word_tokens(tokenizer))
    return Bench(codec, world_prompts(world, codec, tokenizer, args.trajectories), TimedSearch(corpus), extra, model)


async def run(args) -> None:
    b = setup(args, Path(tempfile.mkdtemp(prefix="rollout-limit-")))
    print(f"model {b.model}; starting vLLM (CPU) …", flush=True)
    gen = await start_engine(b.model, args)
    steps = StepCounter(gen.engine)
    try:
        # warm-up over every prompt, not measured: one-off engine costs, and every query the seeded runs
        # will issue enters the search's cache, so measured runs search at (nearly) zero latency
        await paired_run(gen, steps, b, args, "warm")
        print(f"\n{len(b.prompts)} trajectories, max_turns={args.max_turns}, "
              f"max_tokens_per_turn={args.max_tokens_per_turn}, vLLM CPU block size "
              f"{gen.engine.vllm_config.cache_config.block_size}, max_num_seqs {args.max_num_seqs}, "
              f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, {os.cpu_count()} cores\n", flush=True)
        rows = []
        for i in range(args.runs):
            rows.append(await paired_run(gen, steps, b, args, f"r{i}"))
            print(f"run {i + 1}\n{detail(rows[-1])}", flush=True)
        print("\n" + table(rows), flush=True)
    finally:
        await gen.close()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="Paired runs (agent loop, then its floor).")
    p.add_argument("--trajectories", type=int, default=640, help="Trajectories per run, each its own prompt.")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-tokens-per-turn", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--block-size", type=int, default=None, help="KV block size (default: EngineSettings.block_size's, 32 on CPU).")
    p.add_argument("--world", default=None, help="A built world directory (default: build the small test world).")
    return p


def main() -> None:
    sys.path.insert(0, str(ROOT))
    asyncio.run(run(parser().parse_args()))


if __name__ == "__main__":
    main()
