"""A user error leaves the CLI one way: exit code 2, one line `error: …` on stderr, no traceback (no
exception escapes the command) and no usage panel."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from searchr1.cli import build_app
from tests.support.archive_fixture import write_archive


def _searchr1(*args: str) -> Result:
    env = {k: None for k in os.environ if k.startswith(("ROLLOUT_", "INDEX_", "VIEWER_"))}
    return CliRunner().invoke(build_app(), list(args), env=env)


def _one_line_error(r: Result, code: int, text: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert isinstance(r.exception, SystemExit), r.exception  # anything else would print a traceback
    assert r.exit_code == code, (r.exit_code, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], r.stderr


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    write_archive(d / "archive", steps=1, groups_per_step=1)
    return d


def test_view_with_a_directory_without_tokenizer_json(run_dir, tmp_path):
    r = _searchr1("view", str(run_dir), "--tokenizer", str(tmp_path), "--port", "0")
    _one_line_error(r, 2, f"no tokenizer.json at {tmp_path / 'tokenizer.json'}")


def test_view_of_a_directory_without_an_archive(tmp_path):
    _one_line_error(_searchr1("view", str(tmp_path)), 2, "no archive parts")


def test_a_setting_out_of_bounds_names_the_field(run_dir, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[viewer]\nport = 70000\n")
    _one_line_error(_searchr1("view", str(run_dir), "--config", str(config)), 2, "port: Input should be")


def test_index_build_without_out_and_with_a_bad_kind(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "a\\nb"}\n')
    _one_line_error(_searchr1("index", "build", "--corpus", str(corpus), "--kind", "bm25"), 2, "give the corpus")
    config = tmp_path / "run.toml"
    config.write_text('[index]\nkind = "nope"\n')
    r = _searchr1("index", "build", "--config", str(config), "--corpus", str(corpus), "--out", str(tmp_path / "i"))
    _one_line_error(r, 2, "kind: Input should be")


def test_rollout_once_without_a_model():
    _one_line_error(_searchr1("rollout", "once", "--question", "q"), 2, "give --model")


def test_redrive_with_an_unknown_source():
    _one_line_error(_searchr1("streams", "redrive", "--source", "bogus"), 2, "--source must be")


def test_audit_of_a_missing_directory(tmp_path):
    _one_line_error(_searchr1("audit", str(tmp_path / "missing")), 2, "is not a directory")


def test_archive_list_of_an_empty_directory(tmp_path):
    _one_line_error(_searchr1("archive", "list", str(tmp_path)), 2, "no archive parts")


def test_demo_refuses_a_run_directory_that_holds_a_run(tmp_path, monkeypatch):
    from searchr1.core.settings import load_settings
    from searchr1.launcher.demo import resolve_paths
    from searchr1.launcher.settings import LauncherSettings

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "run.toml"
    config.write_text('[launcher]\nrun = "r"\nrun_dir = "RUN"\n')
    steps = resolve_paths(load_settings(LauncherSettings, config), config, None).steps_log
    steps.parent.mkdir(parents=True, exist_ok=True)
    steps.write_text("{}\n")
    _one_line_error(_searchr1("demo", "--config", str(config)), 2, "already holds a run")


def test_up_with_a_config_it_cannot_use(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[launcher]\nlog_tail_lines = -3\n")
    _one_line_error(_searchr1("up", "--config", str(config)), 2, "log_tail_lines")


def test_serve_reward_on_a_port_in_use_fails_with_one_line():
    """A service that cannot start (not a user error) exits 1 through the same helper."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = _searchr1("serve", "reward", "--port", str(busy.getsockname()[1]), "--insecure-no-auth")
    errors = [line for line in r.stderr.splitlines() if not line.startswith("WARNING: ")]
    assert isinstance(r.exception, SystemExit) and r.exit_code == 1, (r.exit_code, r.stderr)
    assert len(errors) == 1 and errors[0].startswith("error: ") and "already in use" in errors[0], r.stderr


def test_models_prepare_with_a_bad_dtype():
    _one_line_error(_searchr1("models", "prepare", "x", "--dtype", "int4"), 2, "--dtype must be")


# the ways a command reported an error before `core.commandline` had the one helper
_OTHER_ERROR_STYLES = re.compile(
    r"typer\.BadParameter\("                      # Typer's usage panel
    r"|(?:typer\.echo|print|console\.print)\(f?[\"']error:"  # its own `error:` line
    r"|\[(?:bold )?red\]"                         # a red echo of the error (rich markup)
    r"|typer\.Exit\((?:code=)?1\)"                # exit 1 after a message of its own
    r"|sys\.exit\(f?[\"']")                      # sys.exit("message"): stderr, exit 1


def offending_lines(text: str) -> list[str]:
    """The lines of `text` that report an error some other way than `core.commandline.fail`/`error`."""
    return [line.strip() for line in text.splitlines() if _OTHER_ERROR_STYLES.search(line)]


def test_the_guard_catches_every_other_style():
    for line in ('raise typer.BadParameter("x")', 'typer.echo(f"error: {exc}", err=True)',
                 'print(f"error: {exc}", file=sys.stderr)', "print('error: x')",
                 'console.print(f"[bold red]searchr1 demo: {exc}[/]")', 'console.print("[red]no[/]")',
                 "raise typer.Exit(1) from None", "raise typer.Exit(code=1)", 'sys.exit("usage: x")'):
        assert offending_lines(line) == [line], line
    for line in ("return error(str(exc))", "fail(str(exc), EXIT_REFUSED)", "raise typer.Exit(run(settings))",
                 'self.mux.say(message, "bold red")', "raise typer.Exit(0 if report.ok else 1)"):
        assert offending_lines(line) == [], line


def test_commands_report_user_errors_through_the_one_helper():
    """No command raises Typer's usage panel, prints its own `error:` line or red message, or exits 1 after
    one: `core.commandline.fail` (and `error`, for run functions returning an exit code) is the one way out."""
    import searchr1

    root = Path(searchr1.__file__).resolve().parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "commandline.py" or path.relative_to(root).parts[:2] == ("core", "api"):
            continue
        offenders += [f"{path.relative_to(root)}: {line}" for line in offending_lines(path.read_text("utf-8"))]
    assert not offenders, offenders
