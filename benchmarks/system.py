"""The whole system, lockstep against asynchronous, each in the regime users would choose: does decoupling
rollout from learning pay on the tiny world when each side has its own cores, and where does the time go.

    .venv/bin/python benchmarks/system.py [--steps 40] [--runs 5] [--variants lockstep,async1,async2]
                                          [--cores N] [--rollout-cores K] [--reward-level auto] [--window 10]
                                          [--eval-samples 4] [--eval-limit N] [--no-eval] [--config BASE]
                                          [--set KEY=VALUE ...] [--search-latency-ms MS] [--out runs/bench-system]

Every variant is a real `searchr1 up` of the base config (configs/tiny-cpu.toml: GRPO, 8 questions × 8
trajectories per step, seed 0, the committed warm start assets/tiny-world/warmstart, the world of seed 0
built once with `searchr1 world build` into `--world`), changed only in its staleness and placement
(`system_variants.py`):

- `lockstep`, colocated: `max_staleness = 0`, every process on all `--cores` cores (`cpu_colocate`), each
  phase taking them in turn — Search-R1's regime, where the hybrid engine gives each phase every GPU;
- `async1`, `async2`, disaggregated: `max_staleness` 1 and 2, the rollout worker (the retriever, reward
  service and Redis beside it) on the first `--rollout-cores` cores and the learner on the rest, so
  generation of step t+1 overlaps training of step t.

`--runs N` repeats the set N times, the order of the variants alternating between runs; the first variant
is the baseline, and each variant's speed-ups are paired with the baseline of the same run (median and
range over the runs). Per run it prints wall time to N steps and to a training-reward level (the
`--window`-step rolling mean of the JSONL's `reward_mean`; `auto` = the highest level every run of every
variant reaches), held-out sampled and greedy EM (`searchr1 eval` of the final snapshot), busy shares,
staleness, token rates and the load average; then the summary over the runs and the per-stage breakdown
from the services' own stage clocks (averaged over the runs; a stacked-bar PNG in the run directory). When
the best asynchronous variant misses 1.4× to the reward level it says why from the stage clocks and prints
the reruns that change the workload: `--search-latency-ms` (slower searches), `--set` (e.g. longer
trajectories), `--config` (a larger policy). Times count from the learner's start (its /metrics answering)
and a first worker's engine up, so start-up is left out; see `system_report.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the system_* helpers when run as a script

from system_report import (
    Figures,
    breakdown_table,
    comparison_table,
    figures,
    max_rolling_reward,
    plot_breakdown,
    to_json,
)
from system_run import (
    ROOT,
    RunRecord,
    Workload,
    evaluate,
    record_from_json,
    record_to_json,
    run_variant,
)
from system_summary import GOAL, mean_figures, paired, summary_table, why
from system_variants import variants

DEFAULT_VARIANTS = "lockstep,async1,async2"


def parse_sets(items: list[str]) -> dict[str, object]:
    """`KEY=VALUE` → {KEY: VALUE}, the value read as TOML (`256`, `true`, `"text"`; bare text as a string)."""
    import tomllib

    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--set wants KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = raw
    return out


def workload_of(args: argparse.Namespace) -> Workload:
    """The base config, its warm start (`[launcher.demo] warmstart_dir`), the overrides, the search delay."""
    import tomllib

    config = (ROOT / args.config).resolve() if not args.config.is_absolute() else args.config
    if not config.is_file():
        raise SystemExit(f"--config {config} not found")
    demo = tomllib.loads(config.read_text()).get("launcher", {}).get("demo", {})
    warm = ROOT / demo.get("warmstart_dir", "assets/tiny-world/warmstart")
    if not (warm / "config.json").is_file():
        raise SystemExit(f"the warm start {warm} of {config.name} is missing (make demo-real writes SmolLM2's)")
    return Workload(config, warm, parse_sets(args.set), args.search_latency_ms)


def main() -> None:
    import os

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = len(os.sched_getaffinity(0))
    p.add_argument("--steps", type=int, default=40, help="training steps per variant (the demo: 150)")
    p.add_argument("--runs", type=int, default=5, help="paired runs of every variant (spreads over them)")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help=f"comma-separated, the first is the baseline; known: {', '.join(variants(2, 1))}")
    p.add_argument("--cores", type=int, default=here, help=f"cores the variants are placed on (default {here}, "
                   "the ones this process may use)")
    p.add_argument("--rollout-cores", type=int, default=None,
                   help="disaggregated variants: cores for the rollout side (default: half, at least 1)")
    p.add_argument("--config", type=Path, default=Path("configs/tiny-cpu.toml"),
                   help="base run config (its [launcher.demo] warmstart_dir is the warm start)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config key in every variant (value read as TOML), repeatable")
    p.add_argument("--search-latency-ms", type=float, default=0.0,
                   help="added to every retriever call (a delaying loopback proxy)")
    p.add_argument("--reward-level", default="auto", help="training-reward level, or auto")
    p.add_argument("--window", type=int, default=10, help="steps in the rolling mean of the reward")
    p.add_argument("--eval-samples", type=int, default=4, help="sampled trajectories per test question")
    p.add_argument("--eval-limit", type=int, default=None, help="evaluate the first N test questions only")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per training run before it is stopped")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-system")
    p.add_argument("--world", type=Path, default=None, help="world directory (default OUT/world; built if missing)")
    p.add_argument("--from", dest="from_dirs", type=Path, nargs="+", default=None,
                   help="print the report of earlier run directories (their records.json, in order) instead "
                        "of running")
    p.add_argument("--png", type=Path, default=None, help="breakdown PNG (default OUT/<stamp>/system-breakdown.png)")
    args = p.parse_args()
    if args.rollout_cores is None:
        args.rollout_cores = max(1, args.cores // 2)
    if args.cores < 2 and not args.from_dirs:
        p.error("the disaggregated variants need at least 2 cores (--cores)")
    try:
        known = variants(args.cores, args.rollout_cores)
    except ValueError as exc:
        p.error(str(exc))
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        p.error(f"unknown variants {unknown}; known: {', '.join(known)}")
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.from_dirs:
        out, runs = args.from_dirs[-1].resolve(), []
        for d in args.from_dirs:
            saved = json.loads((d / "records.json").read_text())
            for run in saved.get("runs") or [saved["records"]]:
                runs.append([record_from_json(r) for r in run])
            args.steps = saved["steps"]
            args.cores = saved.get("cores", args.cores)
            args.rollout_cores = saved.get("rollout_cores", args.rollout_cores)
    else:
        out, runs = run_all(args, [known[n] for n in names], workload_of(args))
    report(args, out, runs)


def run_all(args: argparse.Namespace, chosen: list, workload: Workload) -> tuple[Path, list[list[RunRecord]]]:
    world = (args.world or args.out / "world").resolve()
    if not (world / "manifest.json").is_file():
        print(f"building the world (seed 0) into {world}")
        subprocess.run([sys.executable, "-m", "searchr1.cli", "world", "build", "--seed", "0", "--out", str(world)],
                       check=True, cwd=ROOT)
    out = (args.out / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True)
    print(f"{args.runs} run(s) × {len(chosen)} variants × {args.steps} steps on {args.cores} cores (rollout "
          f"{args.rollout_cores} when disaggregated); runs in {out}; load average {os.getloadavg()[0]:.1f}")
    runs: list[list[RunRecord]] = []
    for r in range(args.runs):
        order = chosen if r % 2 == 0 else chosen[::-1]  # odd runs: the baseline last
        records: list[RunRecord] = []
        for variant in order:
            rec = run_variant(variant, args.steps, world, out / f"run-{r}", args.timeout, workload=workload)
            if not args.no_eval and rec.steps:
                rec.eval = evaluate(rec, args.eval_samples, args.eval_limit)
            records.append(rec)
            runs_json = [[record_to_json(x) for x in run] for run in [*runs, records]]
            (out / "records.json").write_text(json.dumps({
                "steps": args.steps, "cores": args.cores, "rollout_cores": args.rollout_cores,
                "workload": {"config": str(workload.config), "overrides": workload.overrides,
                             "search_latency_ms": workload.search_latency_ms}, "runs": runs_json}))
        runs.append(records)
    return out, runs


def report(args: argparse.Namespace, out: Path, runs: list[list[RunRecord]]) -> None:
    usable = [[r for r in run if r.steps and r.t_up is not None] for run in runs]
    flat = [r for run in usable for r in run]
    if not flat:
        raise SystemExit("no variant completed a step: see the up.log files in " + str(out))
    if args.reward_level == "auto":
        reached = [max_rolling_reward(r, args.window) for r in flat]
        level = min(x for x in reached if x is not None) if any(x is not None for x in reached) else 0.0
    else:
        level = float(args.reward_level)
    names = list(dict.fromkeys(r.variant.name for r in flat))
    base = runs[0][0].variant.name if runs and runs[0] else names[0]
    names = [base, *(n for n in names if n != base)]
    per_run: list[dict[str, Figures]] = []
    for i, run in enumerate(usable):
        figs = {r.variant.name: figures(r, level, args.window) for r in run}
        per_run.append(figs)
        ordered = [figs[n] for n in names if n in figs]
        print(f"\nRun {i + 1} of {len(usable)}: {args.steps} steps per variant; ratios against {ordered[0].label}")
        print("\n".join(comparison_table(ordered, level, args.window)))
    print(f"\nOver {len(usable)} run(s), each variant paired with {base} of the same run (median, range); "
          f"reward level {level:.3f} ({args.window}-step mean):")
    print("\n".join(summary_table(per_run, base, names[1:])))
    means = [mean_figures([run[n] for run in per_run if n in run]) for n in names]
    print("\nWhere the time goes (the services' stage clocks, mean over the runs; seconds and share of each "
          "side's wall time):")
    print("\n".join(breakdown_table(means, "rollout")))
    print()
    print("\n".join(breakdown_table(means, "learner")))
    best_name, best_level = None, None
    for n in names[1:]:
        levels = paired(per_run, base, n).to_level
        med = statistics.median(levels) if levels else None
        if med is not None and (best_level is None or med > best_level):
            best_name, best_level = n, med
    if len(names) > 1 and (best_level is None or best_level < GOAL):
        best = next(m for m in means if m.name == (best_name or names[1]))
        command = f"{sys.executable} benchmarks/system.py --steps {args.steps} --runs {args.runs}"
        print()
        print("\n".join(why(means[0], best, best_level, args.cores, args.rollout_cores, command)))
    png = plot_breakdown(means, args.png or out / "system-breakdown.png",
                         f"{args.steps} GRPO steps per variant, mean of {len(usable)} run(s): wall time by stage")
    (out / "figures.json").write_text(json.dumps({
        "level": level, "window": args.window, "steps": args.steps,
        "runs": [{n: to_json(f) for n, f in run.items()} for run in per_run]}, indent=1))
    print(f"\nbreakdown PNG: {png}\nfigures: {out / 'figures.json'}; load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
