"""Run configs with wrong types or unknown keys are refused at start by every service's command, before
anything is started: a non-zero exit, the offending field named, and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchr1.cli import build_app

# (argv before --config, config table, a field of that table holding an int)
COMMANDS = [
    (["serve", "retriever"], "retriever", "grpc_port"),
    (["serve", "reward"], "reward", "port"),
    (["serve", "rollout"], "rollout", "metrics_port"),
    (["train"], "learner", "metrics_port"),
    (["up"], "launcher", "log_tail_lines"),
    (["world", "build", "--out", "unused-world"], "world", "seed"),
]


def run(argv: list[str], config: Path):
    return CliRunner().invoke(build_app(), [*argv, "--config", str(config)])


def assert_refused(result, field: str) -> None:
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code not in (0, None), output
    assert isinstance(result.exception, SystemExit), f"a traceback escaped: {result.exception!r}\n{output}"
    assert field in output, output


@pytest.mark.parametrize("argv, section, field", COMMANDS, ids=[" ".join(c[0][:2]) for c in COMMANDS])
def test_unknown_key_refused_with_its_name(tmp_path, argv, section, field):
    config = tmp_path / "run.toml"
    config.write_text(f"[{section}]\nmystery_knob = 3\n")
    assert_refused(run(argv, config), "mystery_knob")


@pytest.mark.parametrize("argv, section, field", COMMANDS, ids=[" ".join(c[0][:2]) for c in COMMANDS])
def test_wrong_type_refused_with_the_field_named(tmp_path, argv, section, field):
    config = tmp_path / "run.yaml"
    config.write_text(f"{section}:\n  {field}: not-a-number\n")
    result = run(argv, config)
    assert_refused(result, field)
    assert "valid integer" in result.output + result.stderr, result.output


@pytest.mark.parametrize("argv, section, field", COMMANDS[:3], ids=[" ".join(c[0]) for c in COMMANDS[:3]])
def test_nested_unknown_key_refused_with_its_path(tmp_path, argv, section, field):
    config = tmp_path / "run.toml"
    config.write_text(f"[{section}.redis]\nurl = 'redis://127.0.0.1:1/0'\npasword = 'x'\n"
                      if section == "rollout" else f"[{section}]\n{field} = 1\n[{section}.limits]\nmax_q = 1\n"
                      if section == "retriever" else f"[{section}]\nscorers = {{ nope = 1 }}\n")
    result = run(argv, config)
    assert result.exit_code not in (0, None) and isinstance(result.exception, SystemExit), result.output
