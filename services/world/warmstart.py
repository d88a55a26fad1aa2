"""`searchr1 world warmstart`: the supervised pass that plays, for the tiny world, the role pre-training
plays for a real base model — it teaches the protocol's format, how to read an answer out of a
retrieved passage, and (by heart) the facts of the world's *known* entities. RL then starts from a
policy that can act, but imperfectly.

What it owns: the command's body — load the world, build or load the model, run copy pre-training and
trace training (`training`) on sampled traces (`sft_data`) with rich progress and a deliberate torch
thread count, run the checks (`checks`), save the model directory and write its `warmstart.json`.

Facts it follows (measured with the 0.74M model): fresh worlds every `refresh_steps` force reading
over memorising; the final `<think>` restates the fact before `<answer>`; batches mix all trace kinds
and lengths.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.world.checks import reading_check, reading_world, self_check
from searchr1.world.settings import GeneratorSettings, ModelSettings, WarmstartSettings
from searchr1.world.sft_data import TraceSampler
from searchr1.world.training import CopyResult, WarmstartResult, copy_pretrain, train


@dataclass
class _Start:
    """What the warm start begins from: the world, its settings, tokenizer and model."""

    world: Any
    doc: dict[str, Any]
    gen: GeneratorSettings
    model_settings: ModelSettings
    tokenizer: Any
    model: Any
    probe_world: Any
    """The reading check's world (`checks.reading_world`)."""


def _start(world_dir: Path, model_settings: ModelSettings | None, init: str | Path | None,
           tokenizer_dir: str | Path | None = None) -> _Start:
    """Load the world and its tokenizer (or a real model's own, `tokenizer_dir`: its chat template renders
    the prompts); build a fresh model, or load the one in `init`."""
    import torch

    from searchr1.world.build import load_world
    from searchr1.world.model import init_model
    from searchr1.world.tokenizer import load_tokenizer

    world, doc = load_world(world_dir)
    gen = GeneratorSettings.model_validate(doc["settings"]["generator"])
    ms = model_settings or ModelSettings.model_validate(doc["settings"]["model"])
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    else:
        tokenizer = load_tokenizer(world_dir / "tokenizer")
    if init is None:
        model = init_model(ms, tokenizer)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(init), dtype=torch.float32)
    return _Start(world, doc, gen, ms, tokenizer, model, reading_world(gen, world))


def _progress(console: Any, show_progress: bool) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("warm start"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=not show_progress)


def _train(st: _Start, ws: WarmstartSettings, init: str | Path | None, console: Any, show_progress: bool,
           test: list[Any]) -> tuple[WarmstartResult, CopyResult | None, list[dict[str, Any]]]:
    """Copy pre-training (fresh models only), then trace training with progress and the self-check
    curve every `eval_every` steps. Returns the training result, the copy result and the curve."""
    model, tokenizer = st.model, st.tokenizer
    sampler = TraceSampler(st.gen, st.world.known_entities(), [e.name for e in st.world.entities if not e.known], ws)
    probe_world = st.probe_world
    live = show_progress and console.is_terminal
    curve: list[dict[str, Any]] = []
    progress = _progress(console, show_progress)
    with progress:
        task = progress.add_task("train", total=ws.steps, info="")

        def on_log(step: int, loss: float, lr: float) -> None:
            progress.update(task, info=f"loss {loss:.3f} lr {lr:.2e}")
            if not live and (step % (ws.log_every * 10) == 0 or step == ws.steps):
                console.print(f"step {step}/{ws.steps} loss {loss:.4f} lr {lr:.2e}")

        def on_step(step: int) -> None:
            progress.update(task, completed=step)
            if ws.eval_every and test and step % ws.eval_every == 0 and step < ws.steps:
                check = self_check(model, tokenizer, st.world, test[:32], observation="gold", topk=ws.topk)
                reading = reading_check(model, tokenizer, probe_world, 32, topk=ws.topk)
                model.train()
                curve.append({"step": step, "em": check["em"], "format_valid": check["format_valid"],
                              "searches_per_question": check["searches_per_question"],
                              "value_token_accuracy": reading["value_token_accuracy"]})
                progress.console.print(f"step {step}: self-check EM {check['em']:.3f}, format-valid "
                                       f"{check['format_valid']:.3f}, searches/question "
                                       f"{check['searches_per_question']:.2f}, reading (value tokens) "
                                       f"{reading['value_token_accuracy']:.3f}")

        copied: CopyResult | None = None
        if init is None and ws.copy_steps:
            ctask = progress.add_task("copy", total=ws.copy_steps, info="")

            def on_copy(step: int, loss: float, acc: float) -> None:
                progress.update(ctask, completed=step, info=f"copy loss {loss:.3f} accuracy {acc:.3f}")
                if not live and (step % (ws.log_every * 25) == 0 or step == ws.copy_steps):
                    console.print(f"copy step {step}/{ws.copy_steps} loss {loss:.4f} accuracy {acc:.3f}")

            copied = copy_pretrain(model, ws, len(tokenizer), tokenizer.pad_token_id, on_log=on_copy)
        result = train(model, tokenizer, sampler, ws, on_log=on_log, on_step=on_step)
    return result, copied, curve


def _model_record(st: _Start, init: str | Path | None) -> dict[str, Any]:
    """The trained model's shape: the world's model settings for a fresh model, the loaded model's own
    config for `--init` (a real model's architecture is not the world's)."""
    if init is None:
        return st.model_settings.model_dump(mode="json")
    cfg = st.model.config
    keys = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings")
    return {k: getattr(cfg, k) for k in keys if hasattr(cfg, k)}


def _final_checks(st: _Start, ws: WarmstartSettings, test: list[Any],
                  console: Any) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The greedy self-check on the test questions (gold passage supplied) and the reading check."""
    check: dict[str, Any] | None = None
    if test:
        t0 = time.perf_counter()
        check = self_check(st.model, st.tokenizer, st.world, test, observation="gold", topk=ws.topk)
        check["seconds"] = round(time.perf_counter() - t0, 1)
        console.print(f"self-check (greedy, gold passage supplied, {check['n']} test questions): "
                      f"EM {check['em']:.3f}, format-valid {check['format_valid']:.3f}, "
                      f"searches/question {check['searches_per_question']:.2f}")
    reading = reading_check(st.model, st.tokenizer, st.probe_world, 64, topk=ws.topk)
    console.print(f"reading (teacher-forced, {reading['traces']} unseen traces): value tokens "
                  f"{reading['value_token_accuracy']:.3f}, whole values {reading['value_exact']:.3f}")
    return check, reading


def run_warmstart(world_dir: str | Path, out: str | Path, ws: WarmstartSettings, *,
                  model_settings: ModelSettings | None = None, show_progress: bool = True,
                  init: str | Path | None = None, tokenizer_dir: str | Path | None = None) -> dict[str, Any]:
    """Warm-start a fresh model (or continue the one in `init`) for the world in `world_dir`; save it
    (with tokenizer) into `out` and write `out/warmstart.json`. Returns that report. `tokenizer_dir`: a
    real model's own tokenizer (its chat template renders the prompts) instead of the world's."""
    import torch
    from rich.console import Console

    from searchr1.weightsync import snapshot_digest
    from searchr1.world.model import count_parameters, save_model

    torch.set_num_threads(ws.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    world_dir, out = Path(world_dir), Path(out)
    st = _start(world_dir, model_settings, init, tokenizer_dir)
    console = Console(stderr=True)
    console.print(f"[bold]warm start[/]: {count_parameters(st.model):,} parameters, {ws.steps} steps × "
                  f"{ws.batch_size} traces, lr {ws.lr}, {ws.threads} torch threads, world {world_dir}")
    test = st.doc["questions"]["test"][: ws.eval_questions]
    result, copied, curve = _train(st, ws, init, console, show_progress, test)
    save_model(st.model, st.tokenizer, out)
    report_path = out / "warmstart.json"
    report_path.unlink(missing_ok=True)
    digest = snapshot_digest(out)
    check, reading = _final_checks(st, ws, test, console)
    report = {
        "format": 1, "world": str(world_dir), "world_seed": st.doc["seed"], "seed": ws.seed,
        "init": str(init) if init is not None else None, "steps": result.steps, "batch_size": ws.batch_size,
        "threads": ws.threads, "parameters": count_parameters(st.model), "seconds": round(result.seconds, 1),
        "first_loss": result.losses[0][1] if result.losses else None,
        "final_loss": result.losses[-1][1] if result.losses else None,
        "losses": result.losses, "trace_kinds": result.kinds, "settings": ws.model_dump(mode="json"),
        "model": _model_record(st, init), "sha256": digest,
        "sha256_note": "searchr1.weightsync.snapshot_digest of the directory before warmstart.json was written",
        "copy_pretraining": None if copied is None else {
            "steps": copied.steps, "batch_size": ws.copy_batch_size, "final_accuracy": copied.accuracy,
            "seconds": round(copied.seconds, 1), "losses": copied.losses},
        "self_check": check, "reading": reading, "self_check_curve": curve,
    }
    report_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    console.print(f"saved {out} (sha256 {digest[:16]}…) in {result.seconds / 60:.1f} min; "
                  f"loss {report['first_loss']} → {report['final_loss']}")
    return report
