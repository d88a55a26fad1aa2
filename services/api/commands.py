"""`searchr1 ask`: put a question (or a file of them) to a policy through the agent loop and print each
trajectory as a reader wants it — think, search, information, answer — greedy unless `--temperature` says
otherwise, against a running retriever (`--retriever`, `--run-dir`) or an index directory it serves itself
(`--index`). `--json` prints one JSON object per question instead.

Typer and `searchr1.core.commandline` at import time; the engine, the retriever and the agent loop load
inside the command (`searchr1.api.asking`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from searchr1.core.commandline import (
    EXIT_FAILED,
    error,
    fail,
    field_help,
    model_dir_or_exit,
    settings_or_exit,
)

if TYPE_CHECKING:
    from searchr1.api.asking import AskResult
    from searchr1.cli import Groups

ROLLOUT_SETTINGS = "searchr1.rollout.settings:RolloutSettings"
AGENT_SETTINGS = "searchr1.rollout.settings:AgentSettings"
STYLES = {"think": "italic cyan", "search": "bold yellow", "information": "green", "answer": "bold magenta",
          "text": "red"}


def read_question_file(path: Path) -> list[tuple[str, list[str]]]:
    """(question, gold answers) from a text file (one question a line), a tasks JSONL or a Search-R1
    parquet (gold answers when the rows have them)."""
    from searchr1.core.datasets import DatasetError, parse_row, read_rows

    if not path.is_file():
        fail(f"question file {path} not found")
    if path.suffix in (".jsonl", ".parquet", ".json"):
        try:
            rows = read_rows(path, None)
            questions = [parse_row(r, i, default_split="test") for i, r in enumerate(rows)]
        except DatasetError as exc:
            fail(str(exc))
        out = [(q.question, list(q.golden_answers)) for q in questions]
    else:
        try:
            out = [(line.strip(), []) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read {path}: {exc}")
    if not out:
        fail(f"{path} holds no question")
    return out


def render(console: Any, result: AskResult, golds: list[str], where: str = "") -> None:
    """One trajectory for a person: the question, each block under its name, then the outcome line."""
    from rich.text import Text

    console.rule(f"[bold]{where}question[/]", align="left")
    console.print(result.question, markup=False, highlight=False)
    for turn in result.turns:
        console.rule(f"[{STYLES[turn.kind]}]{turn.kind}[/]", align="left", style="dim")
        text = turn.text
        if turn.kind == "information":  # one passage a line, as the model read them
            text = text.replace("\nDoc ", "\n\nDoc ")
        console.print(Text(text, style=STYLES[turn.kind] if turn.kind != "information" else ""))
    console.rule(style="dim")
    verdict = ""
    if golds:
        from searchr1.api.scoring import score

        correct = result.answer is not None and score(f"<answer>{result.answer}</answer>", golds) == 1.0
        verdict = f" · [{'green' if correct else 'magenta'}]{'correct' if correct else 'wrong'}[/] (gold: {', '.join(golds)})"
    console.print(f"answer: [bold magenta]{result.answer!r}[/] · finish: {result.finish_reason} · "
                  f"{result.num_searches} search(es) · {result.num_turns} turn(s) · "
                  f"{result.generated_tokens} sampled tokens{verdict}", highlight=False)
    if result.error:
        console.print(f"search failed: {result.error}", style="bold red", markup=False, highlight=False)


def ask_command(
    question: Annotated[str | None, typer.Argument(help="The question (or --file).")] = None,
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", help="Questions to ask: a text file (one a line), a tasks JSONL or a Search-R1 parquet "
                             "(with gold answers, each answer is marked correct or wrong).")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help=field_help(ROLLOUT_SETTINGS, "model"))] = None,
    retriever: Annotated[list[str] | None, typer.Option(
        "--retriever", help=field_help(ROLLOUT_SETTINGS, "retriever.addresses", "Repeat for several."))] = None,
    index: Annotated[Path | None, typer.Option(
        "--index", help="An index directory (`searchr1 index build`) to serve in this process instead of a running "
                        "retriever.")] = None,
    run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="A live `searchr1 up` run directory: its retriever and token (RUN_DIR/connection.json).")]
    = None,
    engine: Annotated[str | None, typer.Option(help=field_help(ROLLOUT_SETTINGS, "engine.kind"))] = None,
    temperature: Annotated[float, typer.Option(min=0.0, max=10.0, help="Sampling temperature; 0 is greedy.")] = 0.0,
    max_turns: Annotated[int | None, typer.Option(min=0, max=64, help=field_help(AGENT_SETTINGS, "max_turns"))]
    = None,
    max_tokens_per_turn: Annotated[int | None, typer.Option(
        min=1, help=field_help(AGENT_SETTINGS, "max_tokens_per_turn"))] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", min=1, max=100,
                                              help=field_help(ROLLOUT_SETTINGS, "retriever.top_k"))] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed (with --temperature > 0).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per question (answer, finish reason, "
                                                         "turns, response) instead of the readable view.")] = False,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Run config (TOML/YAML): its rollout table gives engine, agent limits and "
                               "retriever settings.")] = None,
) -> None:
    """Ask a trained policy a question and read how it answered: think, search, information, answer.

    Greedy by default. The search goes to a running retriever (--retriever, or --run-dir of a `searchr1 up`
    run) or to an index directory served in this process (--index). Exit 1 when a search failed."""
    import asyncio

    from searchr1.rollout.settings import RolloutSettings

    if (question is None) == (file is None):
        fail("give a question or --file (one of the two)")
    if sum(x is not None for x in (retriever or None, index, run_dir)) != 1:
        fail("give where to search: --retriever ADDRESS, --index DIR or --run-dir RUN_DIR (one of them)")
    if index is not None and not (index / "manifest.json").is_file():
        fail(f"{index} is not an index directory (no manifest.json); build one with `searchr1 index build`")
    token = None
    if run_dir is not None:
        from searchr1.rollout.commands import run_services

        live = run_services(run_dir)
        retriever, token = live.get("retriever"), live.get("token")
    questions = read_question_file(file) if file is not None else [(str(question), [])]
    settings = settings_or_exit(
        RolloutSettings, config, model=model, engine__kind=engine, agent__temperature=temperature,
        agent__max_turns=max_turns, agent__max_tokens_per_turn=max_tokens_per_turn, retriever__top_k=top_k,
        retriever__addresses=retriever or None, retriever__token=token)
    if not settings.model:
        fail("give --model (or model in the run config's rollout table)")
    model_dir_or_exit(settings.model)
    raise typer.Exit(asyncio.run(_ask_all(settings, questions, index, seed, as_json)))


async def _ask_all(settings: Any, questions: list[tuple[str, list[str]]], index: Path | None, seed: int,
                   as_json: bool) -> int:
    """Open the search (a running retriever, checked first, or the index served here) and the engine once,
    then ask every question; returns the exit code."""
    import contextlib
    import json

    from rich.console import Console

    from searchr1.api.asking import open_asker
    from searchr1.api.search import RetrieverSearch, serve_index
    from searchr1.rollout.evaluation.preflight import PreflightError, check_retriever

    console = Console(highlight=False, stderr=as_json)
    failed = 0
    r = settings.retriever
    async with contextlib.AsyncExitStack() as stack:
        try:
            if index is not None:
                with console.status(f"loading the index {index} …"):
                    search = await stack.enter_async_context(serve_index(index, top_k=r.top_k))
            else:
                search = RetrieverSearch(r.addresses, top_k=r.top_k, token=r.token, retry=r.retry_policy())
                stack.push_async_callback(search.close)
                await check_retriever(search.client, r.top_k)
            with console.status(f"starting the {settings.engine.kind} engine on {settings.model} …"):
                asker = await stack.enter_async_context(open_asker(settings.model, search=search, settings=settings,
                                                                   seed=seed))
        except PreflightError as exc:
            return error(str(exc), EXIT_FAILED)
        except (OSError, ValueError) as exc:
            return error(f"cannot start: {exc}", EXIT_FAILED)
        for i, (q, golds) in enumerate(questions):
            result = await asker.ask(q)
            failed += result.error is not None
            if as_json:
                typer.echo(json.dumps({**result.to_json(), "golden_answers": golds}, ensure_ascii=False))
            else:
                render(console, result, golds, f"[{i + 1}/{len(questions)}] " if len(questions) > 1 else "")
    if failed:
        return error(f"{failed} of {len(questions)} question(s) ended with a failed search (shown above)", EXIT_FAILED)
    return 0


def register(groups: Groups) -> None:
    """Add `ask` to the top-level CLI."""
    groups.app.command("ask")(ask_command)
