"""CLI commands of the tiny world, registered into `searchr1` by `searchr1.cli`:
`searchr1 world build`, `searchr1 world warmstart`, `searchr1 world check`.

Each command parses its flags, loads `WorldSettings` through the one validated override path and calls
the world's own function (`build.build_world`, `warmstart.run_warmstart`, `checks.run_check`). Keep
this module light: heavy imports happen inside those functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from searchr1.core.commandline import fail, field_help, model_dir_or_exit, settings_or_exit

if TYPE_CHECKING:
    from searchr1.cli import Groups

WARMSTART_SETTINGS = "searchr1.world.settings:WarmstartSettings"
WORLD_SETTINGS = "searchr1.world.settings:WorldSettings"

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", help="Run config (TOML/YAML) with a \\[world] table; env WORLD_… overrides it.")]


def build(
    out: Annotated[Path, typer.Option("--out", "-o", help="World directory to write.")],
    seed: Annotated[int | None, typer.Option(min=0, help=field_help(WORLD_SETTINGS, "seed"))] = None,
    config: ConfigOpt = None,
    model: Annotated[bool, typer.Option("--model/--no-model",
                                        help="Also write model-init/ (random Qwen2 + tokenizer).")] = True,
) -> None:
    """Generate a world: corpus.jsonl, train/test parquet (Search-R1 rows), tasks JSONL, tokenizer,
    initial model and manifest.json."""
    from rich.console import Console

    from searchr1.world.build import build_world

    console = Console(stderr=True)
    from searchr1.world.settings import WorldSettings


    settings = settings_or_exit(WorldSettings, config, seed=seed)
    manifest = build_world(settings, out, with_model=model, progress=lambda m: console.print(f"[dim]{m}[/]"))
    c = manifest["counts"]
    console.print(f"[bold green]world[/] seed {manifest['seed']} → {out}: {c['documents']} documents, "
                  f"{c['train']} train / {c['test']} test questions")
    for source, n in c["by_data_source"].items():
        console.print(f"  {source}: {n['train']} train, {n['test']} test")


def _ws_help(name: str, extra: str = "") -> str:
    return field_help(WARMSTART_SETTINGS, name, extra)


def warmstart(
    world: Annotated[Path, typer.Option("--world", "-w", help="World directory from `world build`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Model directory to write (model + tokenizer).")],
    steps: Annotated[int | None, typer.Option(min=1, help=_ws_help("steps"))] = None,
    copy_steps: Annotated[int | None, typer.Option(min=0, help=_ws_help("copy_steps"))]
    = None,
    seed: Annotated[int | None, typer.Option(min=0, help=_ws_help("seed"))] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, help=_ws_help("batch_size"))] = None,
    threads: Annotated[int | None, typer.Option(min=1, help=_ws_help("threads"))] = None,
    eval_questions: Annotated[int | None, typer.Option(min=0, help=_ws_help("eval_questions"))] = None,
    init: Annotated[Path | None, typer.Option(
        help="Continue from this model directory instead of a fresh initialisation.")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        help="Use this tokenizer folder instead of the world's (a real model: --init DIR --tokenizer DIR).")] = None,
    config: ConfigOpt = None,
) -> None:
    """Copy pre-training, then a supervised warm start on synthetic protocol traces (environment tokens
    loss-masked); writes the model directory and its warmstart.json (losses, seed, sha256, self-check,
    reading probe)."""
    from searchr1.world.warmstart import run_warmstart

    if not (world / "world.json").is_file():
        fail(f"{world} is not a world directory (no world.json); run `searchr1 world build`")
    for given in (init, tokenizer):
        if given is not None and not given.is_dir():
            fail(f"{given} is not a directory")
    from searchr1.world.settings import WorldSettings

    settings = settings_or_exit(
        WorldSettings, config, warmstart__steps=steps, warmstart__copy_steps=copy_steps, warmstart__seed=seed,
        warmstart__batch_size=batch_size, warmstart__threads=threads, warmstart__eval_questions=eval_questions)
    run_warmstart(world, out, settings.warmstart, init=init, tokenizer_dir=tokenizer)


def check(
    model: Annotated[Path, typer.Option("--model", "-m", help="Model directory (with tokenizer).")],
    world: Annotated[Path, typer.Option("--world", "-w", help="World directory.")],
    n: Annotated[int, typer.Option(min=1, help="Test questions to check.")] = 64,
    observation: Annotated[str, typer.Option(
        help="'gold': the hop's gold passage is always among the hits; 'bm25': plain BM25 hits.")] = "gold",
    threads: Annotated[int | None, typer.Option(
        min=1, help="torch intra-op threads (default: the warm start's `threads`).")] = None,
) -> None:
    """Greedy self-check with HF generate: EM, format-valid rate and searches per question on
    held-out test questions (a quick look, not the evaluation service)."""
    import json

    from searchr1.world.checks import run_check

    if observation not in ("gold", "bm25"):
        fail("--observation must be 'gold' or 'bm25'")
    model_dir_or_exit(model)
    if not (world / "world.json").is_file():
        fail(f"{world} is not a world directory (no world.json); run `searchr1 world build`")
    from searchr1.world.settings import WarmstartSettings

    threads = threads if threads is not None else WarmstartSettings().threads
    typer.echo(json.dumps(run_check(model, world, n, observation, threads), indent=1))


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""
    groups.world.command("build")(build)
    groups.world.command("warmstart")(warmstart)
    groups.world.command("check")(check)
