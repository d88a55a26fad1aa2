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
