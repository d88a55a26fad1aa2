"""How to reach a running `searchr1 up`: the file `RUN_DIR/connection.json` the launcher writes before it
starts anything, read by the commands that work on a live run (`streams`, `weights rollback`, `audit`,
`eval`, `ask`, `view` with `--run-dir`).

It holds the run name, the Redis URL (with the password of the Redis `up` started: the launcher makes one
per run and gives it to the services by environment only), the run's bearer token and the service
addresses. Those are secrets, so the file is created with mode 0600 (owner read/write only) and replaced
atomically; a reader refuses a file that others may read. It stays after the run stops: its addresses
then answer nothing, and the commands say so.

What this module does not do: start or stop anything, or decide the addresses (the launcher's planner).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

CONNECTION_FILE = "connection.json"


class RunConnectionError(ValueError):
    """No usable connection file in a run directory (missing, unreadable, or readable by others)."""


@dataclass(frozen=True)
class RunConnection:
    """The addresses and secrets of one live `searchr1 up` run."""

    run: str
    """Run name (Redis keys `searchr1:{run}:…`)."""
    redis_url: str
    """Redis URL, password included."""
    token: str = ""
    """The run's bearer token: every server of the run requires it, every client sends it."""
    retriever: str = ""
    """host:port of the retriever's gRPC server ("" when the run has none)."""
    retriever_http: str = ""
    """http://host:port of the retriever's Search-R1 `/retrieve` endpoint."""
    reward: str = ""
    """http://host:port of the reward service."""
    config: str = ""
    """Absolute path of the run config the run was started with (`searchr1 weights export` reads its base
    model from it)."""
    validation_metrics: str = ""
    """http://host:port/metrics of the launcher's validation gauges ("" when validation is off)."""


def connection_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONNECTION_FILE


def write_connection(run_dir: str | Path, connection: RunConnection) -> Path:
    """Write `RUN_DIR/connection.json` with mode 0600 (a temporary file of that mode, then renamed)."""
    path = connection_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(asdict(connection), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read_connection(run_dir: str | Path) -> RunConnection:
    """The connection of the run at `run_dir`; `RunConnectionError` saying what is wrong otherwise."""
    path = connection_path(run_dir)
    if not Path(run_dir).is_dir():
        raise RunConnectionError(f"run directory {run_dir} not found")
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunConnectionError(f"{path} not found: is {run_dir} the run directory of a `searchr1 up` run "
                                 "(--run-dir of up, or [launcher] run_dir)?") from None
    except OSError as exc:
        raise RunConnectionError(f"cannot read {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise RunConnectionError(f"{path} holds secrets but others may read it (mode {stat.S_IMODE(mode):o}): "
                                 f"chmod 600 {path}")
    try:
        doc = json.loads(text)
        return RunConnection(**{k: str(v) for k, v in doc.items() if k in RunConnection.__dataclass_fields__})
    except (ValueError, TypeError, AttributeError) as exc:
        raise RunConnectionError(f"{path} is not a connection file of `searchr1 up` ({exc})") from None
