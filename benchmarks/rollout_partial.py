"""Interruptible (partial) rollouts vs whole-trajectory rollouts around weight pushes, on one vLLM engine,
in the same run.

    .venv/bin/python benchmarks/rollout_partial.py [--trajectories 48] [--short 24] [--long-factor 10]
                                                   [--long-every 8] [--slots 8] [--push-every 8] [--repeats 1]

A long-tailed workload, as multi-turn search produces: one trajectory in `--long-every` is `--long-factor`
times longer than the rest (`--short` tokens; greedy on a tiny random Qwen2, so every trajectory runs to
its length). `--slots` trajectories run at once; after every `--push-every` trajectories started, a new
weight version is pushed (an in-place reload alternating between two snapshot directories that hold the
same weights, so that both modes generate the same tokens and do the same work):

- whole (the default, Search-R1's regime, `rollout/worker.py`): admission stops, the trajectories in
  flight finish under the old weights, the engine reloads, admission resumes;
- partial (`weights.partial_rollouts`, `rollout/partial.py`): the turns in flight are interrupted at their
  next token, the engine reloads, they resume from their prefix under the new weights.

Prints, per mode: trajectories/s, generated tokens/s, the seconds admission was held by pushes (from a push
being due to the weights loaded), and the idle slot-seconds of the engine while work was waiting
(∫ (slots − requests running) dt from the first admission to the last) — then partial/whole ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def idle_slot_seconds(events: Sequence[tuple[float, int]], slots: int, start: float, end: float) -> float:
    """∫ (slots − running) dt over [start, end], `events` being (time, requests running from then on) in
    time order (running is 0 before the first event)."""
    total, running, t = 0.0, 0, start
    for when, now_running in events:
        when = min(max(when, start), end)
        total += (slots - running) * (when - t)
        t, running = when, now_running
    return total + (slots - running) * max(0.0, end - t)


class Counting:
    """A generator that records how many requests run on the engine, over time."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.running = 0
        self.events: list[tuple[float, int]] = []

    async def generate(self, request, request_id):
        self.running += 1
        self.events.append((time.perf_counter(), self.running))
        try:
            return await self.inner.generate(request, request_id)
        finally:
            self.running -= 1
            self.events.append((time.perf_counter(), self.running))

    async def reload(self, weights_path: str, digest: str | None = None) -> None:
        await self.inner.reload(weights_path, digest)


@dataclass
class Figures:
    name: str
    seconds: float = 0.0
    trajectories: int = 0
    tokens: int = 0
    held_s: float = 0.0
    idle_slot_s: float = 0.0
    pushes: int = 0
    interrupted: int = 0
    versions: list[int] = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.name:<8} {self.seconds:7.2f} s  {self.trajectories / self.seconds:6.2f} traj/s  "
                f"{self.tokens / self.seconds:7.0f} tok/s  {self.pushes} pushes  admission held {self.held_s:6.2f} s  "
                f"idle slot-seconds {self.idle_slot_s:7.2f}  turns interrupted {self.interrupted}")


def lengths(n: int, short: int, factor: int, every: int) -> list[int]:
    """Token budgets of the long-tailed workload: every `every`-th trajectory is `factor` × `short`."""
    return [short * factor if i % every == 0 else short for i in range(n)]


async def run_mode(name: str, counting: Counting, gen, budgets: list[int], args,
                   push: Callable[[set], Awaitable[None]]) -> Figures:
    """Keep `slots` trajectories running; before every `push_every`-th admission, `push(inflight)`."""
    from searchr1.rollout.engine import TurnRequest

    fig = Figures(name)
    counting.events.clear()
    inflight: set[asyncio.Task] = set()
    results = []
    t0 = time.perf_counter()
    last_admit = t0
    for i, n in enumerate(budgets):
        if i and i % args.push_every == 0:
            due = time.perf_counter()
            await push(inflight)
            fig.held_s += time.perf_counter() - due
            fig.pushes += 1
        while len(inflight) >= args.slots:
            done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            results += [d.result() for d in done]
        prompt = [5 + i % 97] + list(range(5, 24))
        inflight.add(asyncio.create_task(gen.generate(TurnRequest(prompt_ids=prompt, max_tokens=n, temperature=0.0, top_p=1.0, top_k=-1),
                                                      f"{name}-{i}")))
        last_admit = time.perf_counter()
    if inflight:
        results += [d.result() for d in (await asyncio.wait(inflight))[0]]
    fig.seconds = time.perf_counter() - t0
    fig.trajectories = len(results)
    fig.tokens = sum(len(r.token_ids) for r in results)
    fig.idle_slot_s = idle_slot_seconds(counting.events, args.slots, t0, last_admit)
    fig.versions = sorted({v for r in results for v in (r.versions or [])})
    return fig


async def run(args) -> None:
    sys.path.insert(0, str(ROOT))
    from searchr1.rollout.partial import InterruptibleGenerator
    from searchr1.rollout.settings import EngineSettings
    from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator
    from tests.support.tiny_lm import build_tiny_lm, perturb_weights

    work = Path(tempfile.mkdtemp(prefix="partial-bench-"))
    snapshots = [build_tiny_lm(work / "v0")]
    # the pushed "versions" hold the same weights (written again, reloaded for real), so both modes generate
    # the same greedy tokens and the work compared is the same
    snapshots.append(perturb_weights(snapshots[0], work / "v1", scale=0.0))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    print("starting vLLM (CPU) …", flush=True)
    engine = await VllmGenerator.start(VllmEngineConfig(model=str(snapshots[0]), engine=EngineSettings(
        gpu_memory_utilization=0.05, max_model_len=4096, dtype="float32", max_num_seqs=args.slots)))
    counting = Counting(engine)
    version = [0]

    async def reload() -> None:
        version[0] += 1
        await counting.reload(str(snapshots[version[0] % 2]))

    async def drain_then_reload(inflight: set) -> None:
        if inflight:
            await asyncio.wait(inflight)
        await reload()

    budgets = lengths(args.trajectories, args.short, args.long_factor, args.long_every)
    print(f"{len(budgets)} trajectories, {args.short} tokens, one in {args.long_every} x{args.long_factor} "
          f"({sum(budgets)} tokens); {args.slots} slots; a push every {args.push_every} admissions; vLLM CPU, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}\n", flush=True)
    try:
        await run_mode("warm-up", counting, counting, budgets[: args.slots], args, drain_then_reload)
        for _ in range(args.repeats):
            whole = await run_mode("whole", counting, counting, budgets, args, drain_then_reload)
            partial_gen = InterruptibleGenerator(counting, version[0])
            partial = await run_mode(
                "partial", counting, partial_gen, budgets, args,
                lambda inflight, g=partial_gen: g.swap(reload, lambda: version[0]))
            partial.interrupted = partial_gen.interruptions
            for f in (whole, partial):
                print(f.line())
            print(f"  partial vs whole: {whole.seconds / partial.seconds:.2f}x trajectories/s, admission held "
                  f"{partial.held_s / whole.held_s if whole.held_s else float('nan'):.2f}x, idle slot-seconds "
                  f"{partial.idle_slot_s / whole.idle_slot_s if whole.idle_slot_s else float('nan'):.2f}x; "
                  f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n", flush=True)
    finally:
        await engine.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trajectories", type=int, default=48)
    p.add_argument("--short", type=int, default=24)
    p.add_argument("--long-factor", type=int, default=10)
    p.add_argument("--long-every", type=int, default=8)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--push-every", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
