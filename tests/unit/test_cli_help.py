"""Every command's `--help` shows what its help strings declare: rich markup must not swallow a bracketed
word (`[viewer]`, `[default 8600]`), which renders as an empty gap ("Run config with a  table.").
"""

from __future__ import annotations

import re

import pytest
import typer.main
import typer.rich_utils
from typer.testing import CliRunner

from searchr1.cli import build_app

BRACKETED = re.compile(r"(?<!\\)\[([^\[\]\n]+)\]")
"""A bracketed segment the user should see (`\\[` is rich's escape for a literal bracket)."""
ESCAPED = re.compile(r"\\\[")
BOX = re.compile(r"[│╭╮╰╯─]")


def _commands(cmd, path: tuple[str, ...] = ()):
    yield path, cmd
    if hasattr(cmd, "commands"):  # a group (typer carries its own click)
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))


ALL = list(_commands(typer.main.get_command(build_app())))


def _visible(text: str) -> str:
    return " ".join(BOX.sub(" ", text).split())


def _declared(cmd) -> list[tuple[str, str]]:
    """(where, text) of every help string the command declares: its own and each parameter's."""
    texts = [("help", cmd.help or "")]
    texts += [(p.name or "?", getattr(p, "help", None) or "") for p in cmd.params]
    return texts


@pytest.mark.parametrize("path,cmd", ALL, ids=[" ".join(p) or "searchr1" for p, _ in ALL])
def test_help_keeps_every_bracketed_word(path, cmd, monkeypatch):
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 2000)  # one line per option: nothing wrapped or cut
    result = CliRunner().invoke(build_app(), [*path, "--help"])
    assert result.exit_code == 0, result.output
    shown = _visible(result.output)
    for where, text in _declared(cmd):
        for segment in BRACKETED.findall(text):
            literal = ESCAPED.sub("[", f"[{segment}]")
            assert _visible(literal) in shown, (
                f"`searchr1 {' '.join(path)} --help` drops {literal!r} from {where}'s help (rich markup): escape "
                f"it as \\[ or reword")


def test_help_of_the_viewer_leaves_no_gaps(monkeypatch):
    """`view --help` shows its flags' whole help texts: no word swallowed before a full stop or comma
    ("Address to bind .", "Port .", "with a  table")."""
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 2000)
    shown = _visible(CliRunner().invoke(build_app(), ["view", "--help"]).output)
    assert "Address to bind (loopback by default" in shown and "Port to serve on (0 = any free port)" in shown
    assert not re.search(r"\w  ?[.,;)]", shown.replace("...", "")), shown


def test_help_text_keeps_brackets_through_rich_markup():
    """`help_text` (which `field_help` applies to every settings docstring) escapes what rich would take for
    a style tag; unescaped, the same words vanish."""
    from rich.text import Text

    from searchr1.core.commandline import help_text

    raw = "Run config with a [viewer] table [default 8600; 0 = any free port], top-k [x>=1]."
    assert Text.from_markup(help_text(raw)).plain == raw
    assert Text.from_markup(raw).plain == "Run config with a  table , top-k ."
