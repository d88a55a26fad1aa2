"""The system benchmark over several paired runs (`benchmarks/system.py --runs N`): per variant the
speed-ups against the baseline paired run by run (median and range), held-out EM against the baseline,
the stage breakdown averaged over the runs, and — when the goal (≥ 1.4× to the same reward level) is
missed — why, from the stage clocks, with the workload knobs that change the balance. Pure: `Figures` in,
lines out.

A pair is the baseline and a variant in the same run (taken back to back, the order alternating between
runs), so drift in the machine's load moves both sides of a ratio alike.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from system_report import LEARNER_STAGES, ROLLOUT_STAGES, Figures

GOAL = 1.4
"""Asynchronous disaggregated against lockstep colocated, to the same reward level."""
EM_POINTS = 2.0
"""Held-out EM within this many points of the baseline's."""


@dataclass(frozen=True)
class Paired:
    """One variant against the baseline over the runs where both finished."""

    name: str
    label: str
    to_steps: list[float]
    """Per run: baseline seconds to N steps / the variant's (× sooner)."""
    to_level: list[float]
    """Per run: the same to the reward level (runs where either missed it are left out)."""
    em_delta: list[float]
    """Per run: the variant's sampled EM − the baseline's, in points."""
    seconds: list[float]
    """Per run: the variant's seconds to N steps."""


def ratio(base: float | None, other: float | None) -> float | None:
    return None if not base or not other else base / other


def paired(runs: list[dict[str, Figures]], base: str, name: str) -> Paired:
    """`runs`: per run, variant name → its figures."""
    steps, level, em, secs, label = [], [], [], [], name
    for run in runs:
        b, v = run.get(base), run.get(name)
        if b is None or v is None:
            continue
        label = v.label
        if (r := ratio(b.seconds_to_n, v.seconds_to_n)) is not None:
            steps.append(r)
            secs.append(v.seconds_to_n)
        if (r := ratio(b.seconds_to_level, v.seconds_to_level)) is not None:
            level.append(r)
        if b.sampled_em is not None and v.sampled_em is not None:
            em.append(100 * (v.sampled_em - b.sampled_em))
    return Paired(name, label, steps, level, em, secs)


def spread(values: list[float], fmt: str = "{:.2f}", unit: str = "×") -> str:
    """`median (min–max)` of `values`, `n/a` when empty."""
    if not values:
        return "n/a"
    med = fmt.format(statistics.median(values)) + unit
    if len(values) == 1:
        return med
    return f"{med} ({fmt.format(min(values))}–{fmt.format(max(values))}{unit})"


def summary_table(runs: list[dict[str, Figures]], base: str, names: list[str]) -> list[str]:
    head = ("| variant | runs | × sooner to N steps | × sooner to the reward level | sampled EM Δ pts (mean; range) "
            "| s to N steps |")
    lines = [head, "|---|---|---|---|---|---|"]
    for name in names:
        p = paired(runs, base, name)
        em = "n/a" if not p.em_delta else (f"{statistics.fmean(p.em_delta):+.1f} "
                                           f"({min(p.em_delta):+.1f} to {max(p.em_delta):+.1f})")
        lines.append(f"| {p.label} | {len(p.to_steps)} | {spread(p.to_steps)} | {spread(p.to_level)} | {em} "
                     f"| {spread(p.seconds, '{:.0f}', ' s')} |")
    return lines


def mean_figures(figs: list[Figures]) -> Figures:
    """One variant's figures averaged over its runs (stage seconds and the numbers the tables show)."""
    def avg(attr: str) -> float | None:
        vals = [getattr(f, attr) for f in figs if getattr(f, attr) is not None]
        return statistics.fmean(vals) if vals else None

    def stages(side: str, names: tuple[str, ...]) -> dict[str, float]:
        return {s: statistics.fmean(getattr(f, side).get(s, 0.0) for f in figs) for s in names}

    first = figs[0]
    nums = {a: avg(a) for a in ("seconds_to_n", "seconds_to_level", "final_reward", "sampled_em", "greedy_em",
                                "rollout_busy", "learner_busy", "staleness", "train_tokens_per_s",
                                "gen_tokens_per_s", "load")}
    return replace(first, **nums, rollout_stages=stages("rollout_stages", ROLLOUT_STAGES),
                   learner_stages=stages("learner_stages", LEARNER_STAGES))


def per_step(f: Figures) -> dict[str, float]:
    """Busy seconds per step of each side (every stage but waiting) and the wall seconds per step."""
    n = max(1, f.steps)
    lb = sum(v for k, v in f.learner_stages.items() if k != "queue_wait") / n
    rb = sum(v for k, v in f.rollout_stages.items() if k != "queue_wait") / n
    return {"learner": lb, "rollout": rb, "wall": (f.seconds_to_n or 0.0) / n,
            "fwd_bwd": f.learner_stages.get("forward_backward", 0.0) / n,
            "generation": f.rollout_stages.get("generation", 0.0) / n,
            "search_wait": f.rollout_stages.get("search_wait", 0.0) / n}


def why(base: Figures, best: Figures, achieved: float | None, cores: int, rollout_cores: int,
        command: str) -> list[str]:
    """Why the best asynchronous variant did not reach the goal, from the stage clocks (both averaged over
    the runs), and the knobs that would change the balance, as commands."""
    b, a = per_step(base), per_step(best)
    pace = max(a["learner"], a["rollout"])
    slower = "learner" if a["learner"] >= a["rollout"] else "rollout"
    bound = b["wall"] / pace if pace else float("nan")
    lines = [
        f"Below the goal ({GOAL}× to the same reward level; best: {best.label}, "
        f"{'n/a' if achieved is None else f'{achieved:.2f}×'}). Where the time goes, per step (stage clocks, "
        "mean over the runs):",
        f"- lockstep, every core in turn: learner busy {b['learner']:.2f} s (forward/backward {b['fwd_bwd']:.2f} s) "
        f"+ rollout busy {b['rollout']:.2f} s (generation {b['generation']:.2f} s, search wait "
        f"{b['search_wait']:.2f} s) → {b['wall']:.2f} s per step",
        f"- {best.name}, learner on {cores - rollout_cores} core(s), rollout on {rollout_cores}: learner busy "
        f"{a['learner']:.2f} s ({a['learner'] / b['learner'] if b['learner'] else float('nan'):.2f}× lockstep's), "
        f"rollout busy {a['rollout']:.2f} s ({a['rollout'] / b['rollout'] if b['rollout'] else float('nan'):.2f}×) "
        f"→ {a['wall']:.2f} s per step",
        f"- an asynchronous step is no shorter than its slower side ({slower}, {pace:.2f} s): at most "
        f"{bound:.2f}× lockstep's {b['wall']:.2f} s with a perfect overlap, on this workload and split.",
        "Disaggregation pays when each side keeps most of its speed on its share of the cores, or when one side's "
        "time holds no core (search latency): the cores lockstep leaves idle in a phase are what overlap wins "
        "back. Workloads that move that balance (each a rerun of this command with one change):",
        f"- slower searches (a real retriever or web search; lockstep waits them out with every core idle): "
        f"{command} --search-latency-ms 200",
        f"- longer trajectories (more generation per trained token): {command} "
        "--set rollout.agent.max_tokens_per_turn=192 --set rollout.agent.max_response_tokens=1024",
        f"- a larger policy (SmolLM2-135M, after `make demo-real` wrote its warm start): {command} "
        "--config configs/smollm2-cpu.toml",
    ]
    other = max(1, rollout_cores - 1) if slower == "learner" else min(cores - 1, rollout_cores + 1)
    if other != rollout_cores:
        lines.append(f"- a core more for the slower side ({slower}): {command} --rollout-cores {other}")
    return lines
