"""CLI commands of the pipeline simulator, registered into `searchr1` by `searchr1.cli`: `searchr1 plan
simulate` (the layout, staleness bound, steps per hour and idle GPUs of a recipe on N GPUs) and
`searchr1 plan check` (the simulator against a measured run's wall time, from that run's own clocks).

Keep this module light: Typer at import time only; the simulations are imported inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from searchr1.cli import Groups


def register(groups: Groups) -> None:
    """Add this package's commands to the CLI (a `plan` group)."""
    plan = typer.Typer(help="Size a GPU run with the pipeline simulator, and check the simulator against a "
                            "measured run.", no_args_is_help=True)
    plan.command("simulate")(simulate)
    plan.command("check")(check)
    groups.app.add_typer(plan, name="plan")


def _gpu_counts(text: str) -> list[int]:
    from searchr1.core.commandline import fail

    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(n < 1 or n > 4096 for n in counts):
        fail(f"--gpus wants GPU counts like 8,16,64, got {text!r}")
    return counts


def simulate(
    config: Annotated[list[Path], typer.Option("--config", "-c", help="Run config of a GPU recipe (repeat for several).")],
    gpus: Annotated[str, typer.Option("--gpus", help="GPU counts to size for, comma-separated.")] = "8,16,64",
    gpu: Annotated[str, typer.Option("--gpu", help="GPU model: h100 or h200.")] = "h100",
    searches: Annotated[float | None, typer.Option(help="Searches per trajectory (default 2; a run's step log "
                                                        "says: searches_per_trajectory).")] = None,
    generated_tokens: Annotated[float | None, typer.Option(help="Tokens generated per trajectory (default 300).")]
        = None,
    search_latency_s: Annotated[float | None, typer.Option(help="One search, seconds (default 0.1).")] = None,
    steps: Annotated[int, typer.Option(min=2, max=50, help="Steady-state steps simulated per layout.")] = 4,
) -> None:
    """Print, for each recipe and GPU count, the layout that trains fastest — rollout GPUs per learner
    GPU and the staleness bound — with its steps per hour and idle GPU share, beside Search-R1's colocated
    lockstep on the same GPUs. Rates: the GPU's datasheet, the learner's utilisation measured on an H100,
    decoding as a memory-bound roofline (docs/performance.md, "Sizing a GPU run", lists each source and
    assumption)."""
    from dataclasses import replace

    from searchr1.core.commandline import fail
    from searchr1.core.settings import ConfigError
    from searchr1.simulator.gpu import GPUS, Efficiency
    from searchr1.simulator.sizing import Assumptions, nemo_rl_check, recipe_from_config, size

    counts = _gpu_counts(gpus)
    if gpu.lower() not in GPUS:
        fail(f"--gpu must be one of {', '.join(GPUS)}, got {gpu!r}")
    device = GPUS[gpu.lower()]
    a = Assumptions()
    for field, value in (("searches", searches), ("generated_tokens", generated_tokens), ("search_s", search_latency_s)):
        if value is not None:
            if value < 0:
                fail(f"--{field.replace('_', '-')} must be >= 0")
            a = replace(a, **{field: value})
    eff = Efficiency()
    try:
        recipes = [recipe_from_config(c) for c in config]
    except (ConfigError, ValueError, OSError) as exc:
        fail(str(exc))
    typer.echo(f"{device.name}; per trajectory: {a.prompt_tokens:.0f} prompt tokens, {a.generated_tokens:.0f} "
               f"generated, {a.searches:g} searches of {a.search_s:g} s returning {a.obs_tokens:.0f} tokens; learner "
               f"at {eff.learner_mfu:.1%} MFU (measured), decode at {eff.decode_bw_share:.0%} of HBM bandwidth "
               f"(assumed)")
    typer.echo("| recipe | GPUs | best layout | rollout GPUs per learner GPU | staleness bound | steps/hour "
               "| GPU idle | colocated lockstep: steps/hour, GPU idle | × colocated |")
    typer.echo("|---|---|---|---|---|---|---|---|---|")
    for r in recipes:
        for n in counts:
            try:
                chosen, colo, _ = size(r, n, device, eff, a, steps=steps)
            except ValueError as exc:
                typer.echo(f"| {r.name} | {n} | {exc} | | | | | | |")
                continue
            lay = chosen.layout
            ratio = "—" if lay.colocated else f"{lay.rollout_gpus / lay.learner_gpus:.2f}"
            typer.echo(f"| {r.name} | {n} | {lay.describe()} | {ratio} | "
                       f"{'0 (lockstep)' if lay.max_staleness == 0 else lay.max_staleness} "
                       f"| {chosen.steps_per_hour:.1f} | {chosen.idle_share:.0%} | {colo.steps_per_hour:.1f}, "
                       f"{colo.idle_share:.0%} | {chosen.steps_per_hour / colo.steps_per_hour:.2f}× |")
    check = nemo_rl_check(device, eff)
    typer.echo(f"cross-check: {check}")


def check(
    run: Annotated[Path, typer.Argument(help="A records.json of benchmarks/system.py, or its directory.")],
    seeds: Annotated[int, typer.Option(min=1, max=20, help="Workload draws averaged per prediction.")] = 3,
) -> None:
    """Predict each measured run's wall time from its own stage clocks and compare (exit 1 when a
    prediction is off by more than 15%)."""
    from searchr1.core.commandline import EXIT_FAILED, fail
    from searchr1.simulator.calibrate import TOLERANCE, CalibrationError, check_record, records

    try:
        recs = records(run)
    except (CalibrationError, OSError, ValueError, KeyError) as exc:
        fail(str(exc))
    typer.echo("| run | k | workers | steps | measured s | predicted s | error | learner busy: measured, "
               "predicted | load avg |")
    typer.echo("|---|---|---|---|---|---|---|---|---|")
    bad = 0
    for label, rec in recs:
        try:
            c = check_record(rec, seeds)
        except CalibrationError as exc:
            typer.echo(f"| {label} | {exc} | | | | | | | |")
            bad += 1
            continue
        m, p = c.measured, c.predicted
        bad += not c.ok
        typer.echo(f"| {label} | {m.pipeline.max_staleness} | {m.pipeline.workers} | {m.steps} | {m.wall_s:.0f} "
                   f"| {p.wall_s:.0f} | {c.error:+.1%}{'' if c.ok else ' (over ' + f'{TOLERANCE:.0%})'} "
                   f"| {m.learner_busy:.0%}, {p.learner_busy_s / p.wall_s:.0%} "
                   f"| {'n/a' if m.load is None else f'{m.load:.1f}'} |")
    if bad:
        fail(f"{bad} of {len(recs)} run(s) not predicted within {TOLERANCE:.0%}", EXIT_FAILED)
