"""The whole system, lockstep against asynchronous: does decoupling rollout from learning pay on the tiny
world, and where does the time go.

    .venv/bin/python benchmarks/system.py [--steps 40] [--variants lockstep,async1,async2,async2x2]
                                          [--reward-level auto] [--window 10] [--eval-samples 4]
                                          [--eval-limit N] [--out runs/bench-system] [--world DIR]

Every variant is a real `searchr1 up` of configs/tiny-cpu.toml (GRPO, 8 questions × 8 trajectories per
step, seed 0, the committed warm start assets/tiny-world/warmstart, the world of seed 0 built once with
`searchr1 world build` into `--world`), run one after another, changed only in:

- `lockstep`: `max_staleness = 0` (Search-R1's regime): the learner waits for the whole batch, the
  worker idles while the learner updates and reloads before the next step's tasks;
- `async1`, `async2`: `max_staleness` 1 and 2: the dispatcher keeps k steps' tasks ahead of the weights,
  so the worker samples step t+1 while the learner trains step t (off-policy rows get truncated
  importance weights);
- `async2x2`: `async2` with two rollout workers (two vLLM engines);
- `async2-spin`, `async2-t1`, `async2x2-bind`, `async2-mb32` (`--variants` to add them): `async2` with
  the learner's idle OpenMP threads spinning (`learner.openmp_waits = "spin"`, lockstep's setting; the
  asynchronous variants resolve `auto` to passive waits); `async2` with the learner on one torch thread;
  `async2x2` with worker i's vLLM bound to core i (`VLLM_CPU_OMP_THREADS_BIND`; by default vLLM's CPU
  backend binds every engine to core 0 and reserves core 1); `async2` with micro-batches of 32
  trajectories instead of 8.

Per variant it prints, against the first variant (the baseline, measured in the same run): wall time to N
steps and to a training-reward level (the `--window`-step rolling mean of the JSONL's `reward_mean`;
`auto` = the highest level every variant reaches), held-out sampled and greedy EM (`searchr1 eval` of
the final snapshot on the world's test questions), rollout and learner busy share, mean staleness,
trained and generated tokens per second, the load average; then the per-stage breakdown from the
services' own stage clocks (a table, and a stacked-bar PNG in `--out`). Times count from the learner's
start (its /metrics answering), so vLLM's start-up is left out; see `system_report.py`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the system_* helpers when run as a script

from system_report import (
    breakdown_table,
    comparison_table,
    figures,
    max_rolling_reward,
    plot_breakdown,
    to_json,
)
from system_run import ROOT, RunRecord, Variant, evaluate, record_from_json, record_to_json, run_variant

VARIANTS = {
    "lockstep": Variant("lockstep", "(a) lockstep, max_staleness 0", 0),
    "async1": Variant("async1", "(b) async, max_staleness 1", 1),
    "async2": Variant("async2", "(b) async, max_staleness 2", 2),
    "async2x2": Variant("async2x2", "(c) async, max_staleness 2, 2 workers", 2, workers=2),
    # candidates for the top bottleneck of the asynchronous runs (compare with async2 in the same run)
    "async2-t1": Variant("async2-t1", "async, max_staleness 2, learner on 1 thread", 2,
                         overrides={"learner.threads": 1}),
    "async2-spin": Variant("async2-spin", "async, max_staleness 2, learner threads spin (openmp_waits = spin)",
                           2, overrides={"learner.openmp_waits": "spin"}),
    "async2x2-bind": Variant("async2x2-bind", "async, max_staleness 2, 2 workers, one core each", 2, workers=2,
                             overrides={"launcher.rollout.env.VLLM_CPU_OMP_THREADS_BIND": "{worker_index}"}),
    "async2-mb32": Variant("async2-mb32", "async, max_staleness 2, micro-batches of 32", 2,
                           overrides={"learner.batch.micro_batch_size": 32}),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="training steps per variant (the demo: 150)")
    p.add_argument("--variants", default="lockstep,async1,async2,async2x2",
                   help=f"comma-separated, the first is the baseline; known: {', '.join(VARIANTS)}")
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
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if args.from_dirs:
        out, records = args.from_dirs[-1].resolve(), []
        for d in args.from_dirs:
            saved = json.loads((d / "records.json").read_text())
            records += [record_from_json(r) for r in saved["records"]]
            args.steps = saved["steps"]
    else:
        out, records = run_all(args, names)
    report(args, out, records)


def run_all(args: argparse.Namespace, names: list[str]) -> tuple[Path, list[RunRecord]]:
    world = (args.world or args.out / "world").resolve()
    if not (world / "manifest.json").is_file():
        print(f"building the world (seed 0) into {world}")
        subprocess.run([sys.executable, "-m", "searchr1.cli", "world", "build", "--seed", "0", "--out", str(world)],
                       check=True, cwd=ROOT)
    out = (args.out / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True)
    print(f"{len(names)} variants × {args.steps} steps, one after another; runs in {out}")
    records: list[RunRecord] = []
    for name in names:
        rec = run_variant(VARIANTS[name], args.steps, world, out, args.timeout)
        if not args.no_eval and rec.steps:
            rec.eval = evaluate(rec, args.eval_samples, args.eval_limit)
        records.append(rec)
        (out / "records.json").write_text(json.dumps({"steps": args.steps,
                                                      "records": [record_to_json(r) for r in records]}))
    return out, records


def report(args: argparse.Namespace, out: Path, records: list[RunRecord]) -> None:
    usable = [r for r in records if r.steps and r.t_up is not None]
    if not usable:
        raise SystemExit("no variant completed a step: see the up.log files in " + str(out))
    if args.reward_level == "auto":
        reached = [max_rolling_reward(r, args.window) for r in usable]
        level = min(x for x in reached if x is not None) if any(x is not None for x in reached) else 0.0
    else:
        level = float(args.reward_level)
    figs = [figures(r, level, args.window) for r in usable]
    print()
    print(f"System: {args.steps} steps per variant, GRPO 8 × 8 per step, seed 0; ratios against "
          f"{figs[0].label} (the first variant), measured in this run")
    print("\n".join(comparison_table(figs, level, args.window)))
    print()
    print("Where the time goes (the services' stage clocks, seconds and share of each side's wall time):")
    print("\n".join(breakdown_table(figs, "rollout")))
    print()
    print("\n".join(breakdown_table(figs, "learner")))
    png = plot_breakdown(figs, args.png or out / "system-breakdown.png",
                         f"tiny world, {args.steps} GRPO steps per variant: wall time by stage")
    (out / "figures.json").write_text(json.dumps({"level": level, "window": args.window, "steps": args.steps,
                                                  "figures": [to_json(f) for f in figs]}, indent=1))
    print(f"\nbreakdown PNG: {png}\nfigures: {out / 'figures.json'}")


if __name__ == "__main__":
    main()
