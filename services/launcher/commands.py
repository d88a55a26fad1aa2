"""CLI commands of the launcher, registered into `searchr1` by `searchr1.cli`: `searchr1 up` (also runnable
alone as `python -m searchr1.launcher`, which imports no other service's commands).

Keep this module light: Typer at import time only; everything else is imported inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from searchr1.cli import Groups


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""
    groups.app.command("up")(up)
    groups.app.command("demo")(demo)
    groups.app.command("rehearse")(rehearse)


def up(
    config: Annotated[Path, typer.Option(
        "--config", "-c", help="Run config (TOML/YAML); its launcher table configures this command and "
                         "every service gets it with --config.")],
    run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="Run directory (logs in RUN_DIR/logs); default: run_dir of the launcher table.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the process plan (command line, GPUs and environment of each process, as "
                          "the config's placement table places them), then exit.")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Stream every line of every process to the console (by default it shows "
                                "warnings, errors and tracebacks; RUN_DIR/logs always has everything).")] = False,
) -> None:
    """Run the whole system locally: Redis, retriever, reward, rollout workers and learner.

    Processes start in dependency order, each gated on its health check; each one's output goes to
    RUN_DIR/logs/NAME.log, and the console shows the warnings, errors and tracebacks (every line with
    --verbose) above a progress bar and a status line. Ctrl-C (or the learner ending) stops everything."""
    import asyncio

    from rich.console import Console

    from searchr1.core.commandline import fail
    from searchr1.core.settings import ConfigError, load_settings
    from searchr1.core.tracking import TrackerUnavailable
    from searchr1.launcher.planner import build_plan
    from searchr1.launcher.settings import LauncherSettings
    from searchr1.launcher.specs import dry_run_lines, total_steps
    from searchr1.launcher.status import StatusCollector
    from searchr1.launcher.supervisor import EXIT_REFUSED, Supervisor
    from searchr1.launcher.validation_setup import make_validator

    console = Console(highlight=False)
    try:
        settings = load_settings(LauncherSettings, config)
        plan = build_plan(settings, config, run_dir)
    except (ConfigError, ValueError) as exc:
        fail(str(exc), EXIT_REFUSED)
    for note in plan.notes:
        console.print(f"note: {note}", style="yellow", soft_wrap=True, markup=False)
    if dry_run:
        for line in dry_run_lines(plan):
            console.print(line, soft_wrap=True, markup=False)
        for problem in plan.problems:
            console.print(f"problem: {problem}", style="bold red", soft_wrap=True, markup=False)
        raise typer.Exit(EXIT_REFUSED if plan.problems else 0)
    collector = StatusCollector(
        redis_url=plan.redis_url, run=plan.run, metrics_jsonl=plan.metrics_jsonl,
        learner_metrics_url=plan.learner_metrics_url, jsonl_keys=settings.status.jsonl_keys,
        prometheus_names=settings.status.prometheus_names)
    supervisor = Supervisor(plan, settings, console=console, collector=collector, verbose=verbose,
                            total_steps=total_steps(config))
    try:
        supervisor.validator = make_validator(settings, plan, supervisor.mux.say)
    except TrackerUnavailable as exc:
        fail(str(exc), EXIT_REFUSED)
    raise typer.Exit(asyncio.run(supervisor.run()))


def demo(
    config: Annotated[Path, typer.Option(
        "--config", "-c", help="Run config (TOML/YAML): its launcher and launcher.demo tables plus every service's table.")]
        = Path("configs/tiny-cpu.toml"),
    run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="Run directory (must be new); default: run_dir of the launcher table.")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Stream every line of every process to the console (by default it shows "
                                "warnings, errors and tracebacks; RUN_DIR/logs always has everything).")] = False,
) -> None:
    """The tiny world end to end: world build and warm start (both cached), evaluation of the warm start,
    GRPO training through the real services (`searchr1 up`), evaluation of the result, and a report
    (RUN_DIR/report.md + report.png) with a one-screen summary.

    Every process's output is in RUN_DIR/logs; the console shows the stages, a progress bar and what needs
    attention (everything with --verbose)."""
    import sys

    from rich.console import Console
    from rich.panel import Panel

    from searchr1.core.commandline import fail
    from searchr1.core.settings import ConfigError, load_settings
    from searchr1.launcher.demo import Demo, DemoError, resolve_paths
    from searchr1.launcher.settings import LauncherSettings
    from searchr1.launcher.specs import cli_command

    console = Console(highlight=False)
    try:
        settings = load_settings(LauncherSettings, config)
        paths = resolve_paths(settings, config.resolve(), run_dir)
        report, lines = Demo(settings, config.resolve(), paths, console, cli_command(settings),
                             verbose=verbose).run()
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    except DemoError as exc:
        for line in exc.tail:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        fail(str(exc), exc.code)
    console.print(Panel("\n".join(lines), title=f"searchr1 demo — {report}", expand=False))
    sys.stdout.flush()


def rehearse(
    configs: Annotated[list[Path], typer.Argument(help="Run configs to rehearse (TOML/YAML), e.g. configs/searchr1-*.toml.")],
    out: Annotated[Path, typer.Option("--out", help="Where each rehearsal's run, logs and report.json go.")]
        = Path("runs/rehearsal"),
    steps: Annotated[int, typer.Option("--steps", min=2, max=50, help="Training steps of each rehearsal.")] = 3,
    world: Annotated[Path, typer.Option(
        "--world", help="The tiny world whose questions, corpus and BM25 index stand in for the config's "
                        "(built with `searchr1 world build --seed 0` when missing).")] = Path("runs/world"),
    model: Annotated[Path, typer.Option(
        "--model", help="The stand-in model: a tiny model of the configs' family, with its tokenizer.")]
        = Path("assets/tiny-world/warmstart"),
    services_from: Annotated[Path, typer.Option(
        "--services-from", help="A config whose launcher, rollout, retriever and reward tables a learner-only "
                                "config is rehearsed with.")] = Path("configs/searchr1-3b-grpo.toml"),
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=60, help="Bound on each of a rehearsal's runs.")]
        = 1800.0,
) -> None:
    """Train each run config on this machine's CPUs exactly as configured — its dtype, learning rate and
    schedule, KL and clip settings, micro-batching, mini-batches, checkpoint cadence, weight transport,
    staleness and group size — with only the model, data, index, devices and batch size swapped for
    stand-ins (each swap listed with its reason; any other difference is refused), through the real
    services: `searchr1 up` for --steps steps, the same trajectories replayed in fp32, and a resume from the
    last checkpoint. Checks that the steps ran, the importance ratio stayed in its band, the fp32 master
    weights moved as fp32's would, versions were published in the engine's dtype and reloaded by the
    engine, and the checkpoint round-trips. Configs that rehearse alike (3B and 7B once the model is
    swapped) share one rehearsal. Exit 1 when a check fails, 2 when a config cannot be rehearsed."""
    import json
    import subprocess
    import sys

    from rich.console import Console
    from rich.table import Table

    from searchr1.core.commandline import fail
    from searchr1.core.settings import ConfigError, read_config_file
    from searchr1.launcher.processes import EXIT_FAILED, EXIT_REFUSED
    from searchr1.launcher.rehearsal import RehearsalError, StandIns
    from searchr1.launcher.rehearse_run import plan, run_one

    console = Console(highlight=False)
    if not (model / "config.json").is_file():
        fail(f"no stand-in model at {model} (config.json missing)", EXIT_REFUSED)
    if not (world / "manifest.json").is_file():
        console.print(f"building the tiny world (seed 0) in {world}")
        done = subprocess.run([sys.executable, "-m", "searchr1.cli", "world", "build", "--seed", "0",
                               "--out", str(world)], capture_output=True, text=True)
        if done.returncode != 0:
            fail(f"world build failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}", EXIT_FAILED)
    stand_ins = StandIns(model=model.resolve(), dataset=(world / "train.parquet").resolve(),
                         corpus=(world / "corpus.jsonl").resolve(), index_dir=(world / "index-bm25").resolve())
    try:
        services = read_config_file(services_from)
        planned = plan(configs, stand_ins, out.resolve(), steps, services)
    except (ConfigError, RehearsalError) as exc:
        fail(str(exc), EXIT_REFUSED)
    results = []
    for i, p in enumerate(planned, 1):
        console.print(f"[{i}/{len(planned)}] {p.name}: {', '.join(p.sources)} ({len(p.swaps)} swapped keys)")
        report = run_one(p, out.resolve(), steps, stand_ins, timeout_s)
        results.append(report)
        table = Table(title=f"{p.name}: {'passed' if report.ok else 'FAILED'}", show_lines=False)
        table.add_column("check")
        table.add_column("")
        table.add_column("figures", overflow="fold")
        for c in report.checks:
            table.add_row(c.name, "ok" if c.ok else "FAIL", c.detail)
        console.print(table)
    (out / "rehearsal.json").write_text(json.dumps([r.to_json() for r in results], indent=1, default=str))
    failed = [r.name for r in results if not r.ok]
    if failed:
        fail(f"{len(failed)} of {len(results)} rehearsals failed: {', '.join(failed)} (see {out}/*/report.json)",
             EXIT_FAILED)
    console.print(f"{len(results)} rehearsals passed ({sum(len(r.configs) for r in results)} configs); "
                  f"report: {out / 'rehearsal.json'}")
