"""docs/cli.md stays true to the CLI: its exit-code table lists exactly the codes `core.commandline.EXIT_CODES`
declares (the one place they are named), and every command the app has appears there."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from searchr1.cli import build_app
from searchr1.core.commandline import EXIT_CODES

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()


def _commands(cmd, path=()):
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path


def test_the_exit_code_table_is_the_declared_one():
    section = DOC.split("## Errors and exit codes", 1)[1].split("\n## ", 1)[0]
    documented = [int(m) for m in re.findall(r"^\| (\d+) \|", section, re.MULTILINE)]
    assert documented == [code for code, _ in EXIT_CODES]


def test_every_command_is_listed():
    for path in _commands(typer.main.get_command(build_app())):
        head, *rest = path
        leaf = f"`searchr1 {' '.join(path)}`"
        group = f"`searchr1 {head}" + (f" {rest[0]}`" if rest else "`")
        assert leaf in DOC or (rest and f"`searchr1 {head} " in DOC and f"`{rest[-1]}`" in DOC) or group in DOC, path
