"""The CLI answers --help fast (no heavy imports at start-up) and lists its groups."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from searchr1.cli import build_app


def test_help_lists_groups():
    result = CliRunner().invoke(build_app(), ["--help"])
    assert result.exit_code == 0, result.output
    for name in ("streams", "version"):
        assert name in result.output


def test_each_group_has_real_help():
    app = build_app()
    runner = CliRunner()
    import typer.main

    click_app = typer.main.get_command(app)
    for name, cmd in click_app.commands.items():
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, (name, r.output)
        assert (cmd.help or "").strip(), f"{name} has no help text"
        assert (cmd.help or "").split("\n")[0].strip() in " ".join(r.output.split())


def test_help_imports_nothing_heavy():
    """`searchr1 --help` in a fresh interpreter answers without importing torch, vLLM, FAISS, transformers,
    numpy or sentence-transformers (heavy imports live inside the commands, so help stays instant)."""
    code = (
        "import sys;"
        "from searchr1.cli import build_app; from typer.testing import CliRunner;"
        "r=CliRunner().invoke(build_app(), ['--help']); assert r.exit_code==0;"
        "print([m for m in ('torch','vllm','faiss','transformers','numpy','sentence_transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_version():
    r = CliRunner().invoke(build_app(), ["version"])
    assert r.exit_code == 0 and r.output.strip() == "0.1.0"
