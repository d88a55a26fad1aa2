"""CLI commands of the tiny world, registered into `searchr1` by `searchr1.cli`:
`searchr1 world build`, `searchr1 world warmstart`, `searchr1 world check`.

Keep this module light: Typer at import time only; heavy imports go inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from searchr1.cli import Groups

ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", help="Run config (TOML/YAML) with a \\[world] table; env WORLD_… overrides it.")]


def _settings(config: Path | None, **overrides):
    """WorldSettings from the run config; a bad config exits 2 with the offending field named."""
    from searchr1.core.settings import ConfigError, load_settings
    from searchr1.world.settings import WorldSettings

    try:
        return load_settings(WorldSettings, config, **overrides)
    except (ConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""

    @groups.world.command("build")
    def build(
        out: Annotated[Path, typer.Option("--out", "-o", help="World directory to write.")],
        seed: Annotated[int | None, typer.Option(min=0, help="World seed (same seed → identical files).")] = None,
        config: ConfigOpt = None,
        model: Annotated[bool, typer.Option("--model/--no-model",
                                            help="Also write model-init/ (random Qwen2 + tokenizer).")] = True,
    ) -> None:
        """Generate a world: corpus.jsonl, train/test parquet (Search-R1 rows), tasks JSONL, tokenizer,
        initial model and manifest.json."""
        from rich.console import Console

        from searchr1.world.build import build_world

        console = Console(stderr=True)
        settings = _settings(config, seed=seed)
        manifest = build_world(settings, out, with_model=model, progress=lambda m: console.print(f"[dim]{m}[/]"))
        c = manifest["counts"]
        console.print(f"[bold green]world[/] seed {manifest['seed']} → {out}: {c['documents']} documents, "
                      f"{c['train']} train / {c['test']} test questions")
        for source, n in c["by_data_source"].items():
            console.print(f"  {source}: {n['train']} train, {n['test']} test")

    @groups.world.command("warmstart")
    def warmstart(
        world: Annotated[Path, typer.Option("--world", "-w", help="World directory from `world build`.")],
        out: Annotated[Path, typer.Option("--out", "-o", help="Model directory to write (model + tokenizer).")],
        steps: Annotated[int | None, typer.Option(min=1, help="Optimiser steps on traces.")] = None,
        copy_steps: Annotated[int | None, typer.Option(
            min=0, help="Copy pre-training steps before the traces (0 skips; skipped with --init).")] = None,
        seed: Annotated[int | None, typer.Option(min=0, help="Trace-sampling seed.")] = None,
        batch_size: Annotated[int | None, typer.Option(min=1, help="Traces per step.")] = None,
        threads: Annotated[int | None, typer.Option(min=1, help="torch intra-op threads.")] = None,
        eval_questions: Annotated[int | None, typer.Option(
            min=0, help="Test questions for the greedy self-check at the end (0 skips it).")] = None,
        init: Annotated[Path | None, typer.Option(
            help="Continue from this model directory instead of a fresh initialisation.")] = None,
        tokenizer: Annotated[Path | None, typer.Option(
            help="Use this tokenizer folder instead of the world's (a real model: --init DIR --tokenizer DIR).")] = None,
        config: ConfigOpt = None,
    ) -> None:
        """Copy pre-training, then a supervised warm start on synthetic protocol traces (environment tokens
        loss-masked); writes the model directory and its warmstart.json (losses, seed, sha256, self-check,
        reading probe)."""
        from searchr1.world.settings import WarmstartSettings
        from searchr1.world.warmstart import run_warmstart

        if not (world / "world.json").is_file():
            raise typer.BadParameter(f"{world} is not a world directory (no world.json); run `searchr1 world build`")
        base = _settings(config).warmstart.model_dump()
        overrides = {"steps": steps, "copy_steps": copy_steps, "seed": seed, "batch_size": batch_size, "threads": threads,
                     "eval_questions": eval_questions}
        ws = WarmstartSettings.model_validate({**base, **{k: v for k, v in overrides.items() if v is not None}})
        run_warmstart(world, out, ws, init=init, tokenizer_dir=tokenizer)

    @groups.world.command("check")
    def check(
        model: Annotated[Path, typer.Option("--model", "-m", help="Model directory (with tokenizer).")],
        world: Annotated[Path, typer.Option("--world", "-w", help="World directory.")],
        n: Annotated[int, typer.Option(min=1, help="Test questions to check.")] = 64,
        observation: Annotated[str, typer.Option(
            help="'gold': the hop's gold passage is always among the hits; 'bm25': plain BM25 hits.")] = "gold",
        threads: Annotated[int, typer.Option(min=1, help="torch intra-op threads.")] = 1,
    ) -> None:
        """Greedy self-check with HF generate: EM, format-valid rate and searches per question on
        held-out test questions (a quick look, not the evaluation service)."""
        import json

        import torch
        from transformers import AutoModelForCausalLM

        from searchr1.world.build import load_world
        from searchr1.world.checks import self_check
        from searchr1.world.tokenizer import load_tokenizer

        if observation not in ("gold", "bm25"):
            raise typer.BadParameter("--observation must be 'gold' or 'bm25'")
        torch.set_num_threads(threads)
        w, doc = load_world(world)
        tok = load_tokenizer(model)
        lm = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
        result = self_check(lm, tok, w, doc["questions"]["test"][:n], observation=observation)
        typer.echo(json.dumps(result, indent=1))
