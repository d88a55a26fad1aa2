"""`searchr1 audit RUN_DIR`: the delivery audit of a run (`audit.py`), as a table or `--json`.

Light at import time (Typer only). Reads Redis at `--redis` (a live run), else the run's append-only file
in `RUN_DIR/redis` through a temporary server (a finished one); the archive, checkpoints and logs from
their `searchr1 up` places under the run directory unless given. Exit code 0 when the run kept its
promise (nothing lost, nothing trained twice, archive and checkpoint agreeing), 1 otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from searchr1.core.commandline import fail


def audit_command(
    run_dir: Annotated[Path, typer.Argument(help="The run directory (`searchr1 up --run-dir`).")],
    redis: Annotated[str | None, typer.Option("--redis", help="Redis URL of a live run (default: the "
                                              "run's append-only file in RUN_DIR/redis).")] = None,
    run: Annotated[str | None, typer.Option("--run", help="Run name (default: the learner's, from "
                                            "RUN_DIR/processes.json).")] = None,
    archive: Annotated[Path | None, typer.Option("--archive", help="Archive dir (RUN_DIR/archive).")] = None,
    checkpoints: Annotated[Path | None, typer.Option("--checkpoints",
                                                     help="Checkpoint dir (RUN_DIR/checkpoints).")] = None,
    dispatched: Annotated[Path | None, typer.Option("--dispatched", help="The dispatcher's record of the task "
                                                    "ids it published (RUN_DIR/learner/RUN.dispatched).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Account for every task a run dispatched: trained once, dropped, dead-lettered, in flight, lost
    or trained twice; the learner's resumes and checkpoint; every worker's weight version."""
    import contextlib

    import redis as redis_py

    from searchr1.learner.tools.audit import DeadRecord, audit, table_rows
    from searchr1.learner.tools.audit_sources import (
        aof_redis,
        read_archive,
        read_checkpoint,
        read_logs,
        read_streams,
        run_identity,
    )
    from searchr1.learner.tools.dead_tasks import dead_tasks_path, read_dead_tasks
    from searchr1.learner.tools.dispatch_log import dispatch_log_path, read_dispatched
    from searchr1.streams import StreamKeys

    if not run_dir.is_dir():
        fail(f"{run_dir} is not a directory")
    recorded_run, _url = run_identity(run_dir)
    run = run or recorded_run
    if run is None:
        fail("no run name recorded in RUN_DIR/processes.json: pass --run")
    with contextlib.ExitStack() as stack:
        url = redis
        if url is None:
            try:
                url = stack.enter_context(aof_redis(run_dir / "redis"))
            except (FileNotFoundError, RuntimeError) as exc:
                fail(f"{exc}; pass --redis URL of the live run")
        try:
            tasks, groups, dead, announced = read_streams(url, run)
        except redis_py.RedisError as exc:
            fail(f"Redis at {url} did not answer: {exc}")
    # the dispatcher's record of dead-lettered tasks: what the dead stream held, even where Redis lost it
    recorded = read_dead_tasks(dead_tasks_path(run_dir / "learner", run))
    dead = [*dead, *(DeadRecord(StreamKeys(run).tasks, tid, reason) for tid, reason in recorded.items())]
    resumes, drops, workers = read_logs(run_dir / "logs")
    report = audit(tasks, groups, dead, read_archive(archive or run_dir / "archive"),
                   read_checkpoint(checkpoints or run_dir / "checkpoints"), drop_reasons=drops,
                   learner_resumes=resumes, announced_version=announced, worker_versions=workers,
                   dispatch_log=read_dispatched(dispatched or dispatch_log_path(run_dir / "learner", run)))
    if as_json:
        typer.echo(json.dumps(report.as_json(), indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"delivery audit of run {run!r} ({run_dir})")
        table.add_column("")
        table.add_column("", overflow="fold")
        for what, figure in table_rows(report):
            table.add_row(what, figure)
        Console().print(table)
    raise typer.Exit(0 if report.ok else 1)


def register_audit(app: typer.Typer) -> None:
    """Add `audit` to the top-level CLI."""
    app.command("audit")(audit_command)
