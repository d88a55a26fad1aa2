"""The `searchr1 archive` commands: `list` the parts of a trajectory archive, `show` trajectories for a
person to read, `export` them to a `datasets` Dataset on disk, Parquet or JSONL.

Owns the presentation; the file format and the filters are `archive.py`'s. Light at import time (Typer
only): pyarrow, rich and datasets are imported inside the commands. `show` and `export` take the latest
copy of a step archived twice (see `archive.py`) unless `--all-copies` is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from searchr1.core.commandline import fail
from searchr1.core.protocol import tag_segments

TAG_STYLES = {"think": "italic cyan", "search": "bold yellow", "information": "dim green on grey11",
              "answer": "bold magenta"}
"""How `show` sets each Search-R1 tag apart; the environment's `<information>` blocks are dimmed on a
background, so what the model wrote and what the retriever returned read differently."""


Dir = Annotated[Path, typer.Argument(help="Archive directory (a run's RUN_DIR/archive).")]
MinStep = Annotated[int | None, typer.Option("--min-step", help="First step shown.")]
MaxStep = Annotated[int | None, typer.Option("--max-step", help="Last step shown.")]
TaskId = Annotated[str | None, typer.Option("--task-id", help="Only this task.")]
Source = Annotated[str | None, typer.Option("--data-source", help="Only this data source.")]
Finish = Annotated[str | None, typer.Option("--finish-reason", help="Only this finish reason.")]
MinReward = Annotated[float | None, typer.Option("--min-reward", help="Reward at least this.")]
MaxReward = Annotated[float | None, typer.Option("--max-reward", help="Reward at most this.")]
AllCopies = Annotated[bool, typer.Option("--all-copies", help="Keep every copy of a step archived twice.")]


def styled_segments(text: str) -> list[tuple[str, str]]:
    """Split a response into (segment, style) pairs by Search-R1 tag (untagged text: no style)."""
    return [(segment, TAG_STYLES[tag] if tag else "") for segment, tag in tag_segments(text)]


def _select(directory, all_copies, **filters):
    """The archive's rows (latest copies unless `all_copies`) that pass the filters; a bad directory is a
    usage error."""
    from searchr1.learner.tools.archive import ArchiveError, Filter, latest_copies, read

    try:
        table = read(directory)
    except (ArchiveError, OSError) as exc:
        fail(str(exc))
    if not all_copies:
        table = latest_copies(table)
    return Filter(**filters).apply(table)


def list_parts(directory: Dir) -> None:
    """The archive's part files: steps, groups, rows and size; and how many steps were archived twice."""
    from rich.console import Console
    from rich.table import Table

    from searchr1.learner.tools.archive import ArchiveError, describe, latest_copies, read

    try:
        infos = describe(directory)
    except ArchiveError as exc:
        fail(str(exc))
    if not infos:
        fail(str(ArchiveError(f"no archive parts (part-NNNNNN.parquet) in {directory}")))
    table = Table("part", "steps", "groups", "rows", "bytes")
    for i in infos:
        table.add_row(i.path.name, f"{i.first_step}-{i.last_step}", str(i.groups), str(i.rows), str(i.bytes))
    console = Console()
    console.print(table)
    rows = read(directory, columns=["step", "task_id"])
    dup = rows.num_rows - latest_copies(rows).num_rows
    console.print(f"{sum(i.rows for i in infos)} trajectories in {len(infos)} parts; "
                  f"{dup} rows are earlier copies of a step archived again after a restart")


def show(directory: Dir, min_step: MinStep = None, max_step: MaxStep = None, task_id: TaskId = None,
         data_source: Source = None, finish_reason: Finish = None, min_reward: MinReward = None,
         max_reward: MaxReward = None, all_copies: AllCopies = False,
         limit: Annotated[int, typer.Option(min=1, help="Print at most this many trajectories.")] = 20) -> None:
    """Print trajectories for a person to read: the question, the response (the retriever's
    <information> blocks set apart), the reward and its components."""
    from rich.console import Console

    table = _select(directory, all_copies, min_step=min_step, max_step=max_step, task_id=task_id,
                    data_source=data_source, finish_reason=finish_reason, min_reward=min_reward,
                    max_reward=max_reward)
    console = Console()
    shown = table.slice(0, limit).to_pylist()
    for r in shown:
        console.print(_panel(r))
    console.print(f"{len(shown)} of {table.num_rows} matching trajectories shown")


def export(directory: Dir,
           out: Annotated[Path, typer.Argument(help="Output directory (datasets) or file (parquet, jsonl).")],
           fmt: Annotated[str, typer.Option("--format", help="datasets (save_to_disk) | parquet | jsonl.")]
           = "datasets",
           min_step: MinStep = None, max_step: MaxStep = None, task_id: TaskId = None,
           data_source: Source = None, finish_reason: Finish = None, min_reward: MinReward = None,
           max_reward: MaxReward = None, all_copies: AllCopies = False) -> None:
    """Export the (filtered) trajectories, one row each, with every archive column."""
    if fmt not in ("datasets", "parquet", "jsonl"):
        fail(f"--format must be datasets, parquet or jsonl, not {fmt!r}")
    table = _select(directory, all_copies, min_step=min_step, max_step=max_step, task_id=task_id,
                    data_source=data_source, finish_reason=finish_reason, min_reward=min_reward,
                    max_reward=max_reward)
    if fmt == "datasets":
        import datasets
        from datasets.table import InMemoryTable

        datasets.Dataset(InMemoryTable(table)).save_to_disk(str(out))
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out, compression="zstd")
    else:
        import json

        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            for row in table.to_pylist():
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    typer.echo(f"wrote {table.num_rows} trajectories to {out} ({fmt})")


def _panel(r: dict):
    """One archived trajectory as a rich Panel: question, golden answers, the styled response, reward."""
    import json

    from rich.panel import Panel
    from rich.text import Text

    body = Text()
    body.append("question: ", style="bold")
    body.append(f"{r['question']}\n")
    body.append(f"golden answers: {', '.join(r['golden_answers'])}\n\n", style="dim")
    for segment, style in styled_segments(r["response_text"] or "(no response text archived)"):
        body.append(segment, style=style or None)
    parts = ", ".join(f"{k} {v:g}" for k, v in json.loads(r["reward_components"]).items())
    body.append(f"\n\nreward {r['reward']:g}" + (f" ({parts})" if parts else ""), style="bold")
    body.append(f"  finish {r['finish_reason']}, {r['num_turns']} turns, {r['num_searches']} searches")
    title = Text(f"step {r['step']} · task {r['task_id']} [{r['data_source']}] · trajectory {r['index']} · "
                 f"version {r['policy_version']} · {r['worker_id']}")
    return Panel(body, title=title, title_align="left")


def register_archive(group: typer.Typer) -> None:
    """Add `list`, `show` and `export` to the `archive` group."""
    group.command("list")(list_parts)
    group.command("show")(show)
    group.command("export")(export)
