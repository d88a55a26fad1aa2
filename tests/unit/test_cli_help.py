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


@pytest.mark.parametrize("path,cmd", ALL, ids=[" ".join(p) or "searchr1" for p, _ in ALL])
def test_help_names_types_plainly_and_config_has_its_short_flag(path, cmd, monkeypatch):
    """Typer in its tested range (pyproject) prints TEXT/INTEGER/PATH, not `<bool>` or `<list[str]>`; every
    command that takes a run config takes it as -c too."""
    monkeypatch.setenv("COLUMNS", "200")
    r = CliRunner().invoke(build_app(), [*path, "--help"])
    assert r.exit_code == 0, r.output
    assert not re.search(r"<(bool|str|int|float|path|list\[)", r.output, re.IGNORECASE), r.output
    for p in getattr(cmd, "params", []):
        if "--config" in getattr(p, "opts", []):
            assert "-c" in p.opts, f"{' '.join(path)}: --config without -c"


def test_settings_backed_flags_show_their_defaults(monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    out = _visible(CliRunner().invoke(build_app(), ["eval", "--help"]).output)
    assert "Turns that may search; one final answer-only turn follows. (the run config's when not given) [default: 4]" in out
    assert "Base URL of the reward service. [default: http://127.0.0.1:8300]" in out
    out = _visible(CliRunner().invoke(build_app(), ["serve", "rollout", "--help"]).output)
    assert "[default: redis://127.0.0.1:6379/0]" in out and "[default: 9403]" in out
