"""Every command answers bad input with one line on stderr (`error: …`, after any WARNING lines) and the exit
code docs/cli.md documents — 2 for input it cannot use, 1 for a service or file that failed it — and never a
traceback. Each row is a bad input users meet: Redis not running for the commands that need it, corrupt
Parquet files, a missing model directory (refused at once, with its path, without asking a Hub), a port in
use, a typo in a service table, a run directory without its connection file, flags out of range, missing or
unparsable configs. The evaluation's refused tokens and unreachable services are in test_eval_preflight.py,
`ask`'s in test_api_ask.py, the exporter's in test_weights_export.py."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import WARMSTART
from tests.support.archive_fixture import write_archive


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Case:
    id: str
    args: Callable[[Path], list[str]]
    code: int
    text: str | Callable[[Path], str]
    stdout: bool = False
    """The command reports on stdout (`up` lists every problem it refuses on, one line each)."""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Bad and good inputs, made once: a corrupt parquet, an archive with a corrupt part, a BM25 index, a run
    directory with a connection file others may read, configs."""
    from searchr1.core.run_connection import RunConnection, write_connection
    from searchr1.retriever.builder import build_index

    d = tmp_path_factory.mktemp("bad")
    (d / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
    write_archive(d / "run" / "archive", steps=4, groups_per_step=2, every_steps=2)
    (d / "run" / "archive" / "part-000000.parquet").write_bytes(b"truncated")
    (d / "corpus.jsonl").write_text('{"id": "0", "contents": "\\"A\\"\\nA is a word."}\n')
    build_index(d / "corpus.jsonl", d / "index", "bm25")
    write_connection(d / "open-run", RunConnection(run="r", redis_url="redis://:pw@127.0.0.1:1/0"))
    os.chmod(d / "open-run" / "connection.json", 0o644)
    (d / "typo.toml").write_text("[rollout.agent]\nmax_turnz = 3\n[launcher]\nrun = \"t\"\n")
    (d / "unparsable.toml").write_text("x = [\n")
    (d / "tasks.jsonl").write_text(json.dumps({"task_id": "t", "question": "q?", "golden_answers": ["a"]}) + "\n")
    return d


REDIS_DOWN = f"redis://127.0.0.1:{_closed_port()}/0"

CASES = [
    # Redis not running
    Case("streams status, Redis down", lambda d: ["streams", "status", "--redis", REDIS_DOWN], 1, "cannot use Redis at"),
    Case("streams dead, Redis down", lambda d: ["streams", "dead", "--redis", REDIS_DOWN], 1, "cannot use Redis at"),
    Case("streams redrive, Redis down", lambda d: ["streams", "redrive", "--redis", REDIS_DOWN], 1,
         "cannot use Redis at"),
    Case("weights rollback, Redis down", lambda d: ["weights", "rollback", "3", "--redis", REDIS_DOWN], 1,
         "cannot use Redis at"),
    Case("train, Redis down", lambda d: ["train", "--redis", REDIS_DOWN, "--model", str(WARMSTART), "--max-steps", "1"],
         1, "cannot use Redis at"),
    # an up run's Redis from its run directory
    Case("ops command, run dir without connection.json", lambda d: ["streams", "status", "--run-dir", str(d)], 2,
         "connection.json not found"),
    Case("ops command, connection.json others may read", lambda d: ["streams", "status", "--run-dir",
                                                                    str(d / "open-run")], 2, "chmod 600"),
    # corrupt parquet
    Case("data prepare, corrupt parquet", lambda d: ["data", "prepare", str(d / "corrupt.parquet"), str(d / "o.jsonl")],
         2, "is not a readable parquet file"),
    Case("archive list, a corrupt part", lambda d: ["archive", "list", str(d / "run" / "archive")], 2,
         "part-000000.parquet cannot be read"),
    Case("archive show, a corrupt part", lambda d: ["archive", "show", str(d / "run" / "archive")], 2,
         "part-000000.parquet cannot be read"),
    Case("archive export, a corrupt part", lambda d: ["archive", "export", str(d / "run" / "archive"),
                                                      str(d / "x.jsonl")], 2, "part-000000.parquet cannot be read"),
    Case("eval, corrupt test set", lambda d: ["eval", "--model", str(WARMSTART), "--data", str(d / "corrupt.parquet")],
         2, "is not a readable parquet file"),
    # a missing model directory: at once, with its path
    Case("rollout once, no model dir", lambda d: ["rollout", "once", "--question", "q", "--model", str(d / "m")], 2,
         lambda d: f"model directory {d / 'm'} not found"),
    Case("world check, no model dir", lambda d: ["world", "check", "--model", str(d / "m"), "--world", str(d)], 2,
         lambda d: f"model directory {d / 'm'} not found"),
    Case("eval, no model dir", lambda d: ["eval", "--model", str(d / "m"), "--data", str(d / "tasks.jsonl")], 2,
         lambda d: f"model directory {d / 'm'} not found"),
    Case("serve rollout, no model dir", lambda d: ["serve", "rollout", "--model", str(d / "m")], 2,
         lambda d: f"directory {d / 'm'} not found"),
    Case("train, no model dir", lambda d: ["train", "--model", str(d / "m")], 2,
         lambda d: f"directory {d / 'm'} not found"),
    Case("ask, no model dir", lambda d: ["ask", "q", "--model", str(d / "m"), "--index", str(d / "index")], 2,
         lambda d: f"model directory {d / 'm'} not found"),
    Case("view --model, no model dir", lambda d: ["view", "--model", str(d / "m"), "--index", str(d / "index")], 2,
         lambda d: f"model directory {d / 'm'} not found"),
    Case("a model path that is a file", lambda d: ["rollout", "once", "--question", "q", "--model", str(d / "tasks.jsonl")],
         2, "is a file, not a model directory"),
    Case("a model directory without config.json", lambda d: ["rollout", "once", "--question", "q", "--model", str(d)],
         2, "has no config.json"),
    # configs
    Case("a missing config", lambda d: ["eval", "--model", str(WARMSTART), "--data", str(d / "tasks.jsonl"), "-c",
                                        str(d / "nope.toml")], 2, "config file not found"),
    Case("an unparsable config", lambda d: ["serve", "reward", "-c", str(d / "unparsable.toml")], 2, "cannot parse"),
    Case("a typo in a service table", lambda d: ["rollout", "once", "--question", "q", "--model", str(WARMSTART),
                                                 "-c", str(d / "typo.toml")], 2, "agent.max_turnz: Extra inputs"),
    Case("up refuses a typo in any service table", lambda d: ["up", "-c", str(d / "typo.toml"), "--run-dir",
                                                              str(d / "up-run")], 2,
         "refusing to start: [rollout] agent.max_turnz: Extra inputs are not permitted", stdout=True),
    # usage
    Case("a flag out of range", lambda d: ["streams", "dead", "--count", "0"], 2, "not in the range 1<=x<=10000"),
    Case("an unknown command", lambda d: ["streems"], 2, "No such command 'streems'"),
    Case("an unknown option", lambda d: ["eval", "--modle", "x"], 2, "No such option: --modle"),
    Case("a missing argument", lambda d: ["data", "prepare"], 2, "Missing argument"),
    Case("an unknown --source", lambda d: ["streams", "redrive", "--source", "bogus"], 2, "--source must be"),
    Case("a file where a directory must go", lambda d: ["world", "build", "--out", str(d / "tasks.jsonl"),
                                                        "--no-model"], 2, "already exists"),
    Case("weights export of a missing run", lambda d: ["weights", "export", str(d / "nope"), "--out", str(d / "e")], 2,
         "run directory"),
    Case("weights export with a bad dtype", lambda d: ["weights", "export", str(d), "--out", str(d / "e"), "--dtype",
                                                       "int4"], 2, "--dtype must be one of"),
]


def _check(result, case: Case, d: Path) -> None:
    text = case.text(d) if callable(case.text) else case.text
    assert isinstance(result.exception, SystemExit), (case.id, repr(result.exception), result.output[-2000:])
    assert result.exit_code == case.code, (case.id, result.exit_code, result.output[-2000:])
    assert "Traceback" not in result.output, (case.id, result.output[-2000:])
    if case.stdout:
        assert text in result.stdout, (case.id, result.stdout[-2000:])
        return
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("WARNING: ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], (case.id, result.stderr[-2000:])
    assert not lines[0].startswith("error: unexpected "), (case.id, lines[0])  # answered, not caught by the guard


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_its_exit_code(case, files, monkeypatch):
    from searchr1.cli import build_app

    monkeypatch.chdir(files)
    env = {k: None for k in os.environ if k.startswith(("ROLLOUT_", "LEARNER_", "VIEWER_", "LAUNCHER_", "INDEX_"))}
    result = CliRunner().invoke(build_app(), case.args(files), env={**env, "COLUMNS": "300"})
    _check(result, case, files)


def test_a_port_in_use(files):
    """The retriever's gRPC port, the reward service's and the viewer's, each taken: exit 1, one line."""
    from searchr1.cli import build_app

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        for args in (["serve", "retriever", "--index", str(files / "index"), "--grpc-port", port, "--http-port", "0",
                      "--insecure-no-auth"],
                     ["serve", "reward", "--port", port, "--insecure-no-auth"],
                     ["view", str(files / "run"), "--port", port, "--insecure-no-auth"]):
            result = CliRunner().invoke(build_app(), args, env={"COLUMNS": "300"})
            _check(result, Case(args[1], lambda d, a=args: a, 1, "in use"), files)


def test_no_case_may_hide_a_traceback_behind_the_guard():
    """The last-resort guard names what it caught; the table above must be answered by the commands
    themselves (their own words), never by it."""
    from searchr1.core.commandline import describe_unexpected

    message, code = describe_unexpected(KeyError("x"))
    assert message.startswith("unexpected KeyError") and "SEARCHR1_TRACEBACK=1" in message and code == 1
    assert describe_unexpected(FileExistsError(17, "File exists", "/x")) == ("already exists: /x: File exists", 2)


def test_a_safetensors_write_that_fails_is_a_failure_and_a_corrupt_file_a_bad_input(tmp_path):
    """A full disk while a checkpoint is written exits 1 (the launcher restarts the learner), not 2 (which
    stops the run as a configuration error); a file safetensors cannot read stays a bad input (2)."""
    from safetensors import SafetensorError

    from searchr1.core.commandline import describe_unexpected

    full = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    message, code = describe_unexpected(full)
    assert code == 1 and message.startswith("cannot write a safetensors file") and "No space left" in message
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08" + b"\x00" * 7 + b"notjson!")
    from safetensors.numpy import load_file

    with pytest.raises(SafetensorError) as read_error:
        load_file(bad)
    message, code = describe_unexpected(read_error.value)
    assert code == 2 and message.startswith("not a readable safetensors file")
