"""Where the delivery audit (`audit.py`) gets its records: Redis (the tasks, trajectories and dead streams
and both consumer groups' pending lists), the trajectory archive, the latest checkpoint's `state.json`,
and the processes' logs under `RUN_DIR/logs` (the learner's resumes and drop reasons, each rollout
worker's last loaded weight version).

A finished run's Redis is gone with the launcher, but its append-only file is not (`searchr1 up` keeps one
in `RUN_DIR/redis`): `aof_redis` copies that directory to a temporary one and serves it on a free loopback
port for the time of the audit, so the run's own file is never touched.

Blocking (Redis with the synchronous client, Parquet, files): a command-line tool's reader.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import redis as redis_py

from searchr1.core.schemas import TASK_ID_PATTERN, SchemaError, Task, TrajectoryGroup, decode, read_envelope
from searchr1.learner.algo.consumed import decode as decode_consumed
from searchr1.learner.tools.audit import CheckpointRecord, DeadRecord, StreamRecord, TrainedRow
from searchr1.streams import PAYLOAD_FIELD, TASKS_GROUP, TRAJECTORIES_GROUP, StreamKeys

_RESUMED = re.compile(r"resumed from step (\d+) \(version (\d+)\)")
_DROPPED = re.compile(r"dropping group of task (\S+): (.+)$")
_LOADED = re.compile(r"loaded weight version (\d+)")
_BATCH = 1000
REDIS_TIMEOUT_S = 30.0
"""Seconds the audit waits for Redis to connect or answer one call before it gives up with an error."""


def _sid(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _entries(client: redis_py.Redis, key: str) -> Iterator[tuple[str, dict]]:
    start = "-"
    while True:
        rows = client.xrange(key, min=start, max="+", count=_BATCH)
        for raw_id, fields in rows:
            yield _sid(raw_id), fields
        if len(rows) < _BATCH:
            return
        start = "(" + _sid(rows[-1][0])


def _group_state(client: redis_py.Redis, key: str, group: str) -> tuple[set[str], str | None]:
    """The entry ids pending in `group` and its last-delivered id (None: no such group)."""
    try:
        groups = client.xinfo_groups(key)
    except redis_py.ResponseError:
        return set(), None
    last = next((_sid(g["last-delivered-id"]) for g in groups if _sid(g["name"]) == group), None)
    if last is None:
        return set(), None
    pending: set[str] = set()
    start = "-"
    while True:
        rows = client.xpending_range(key, group, min=start, max="+", count=_BATCH)
        pending.update(_sid(p["message_id"]) for p in rows)
        if len(rows) < _BATCH:
            break
        start = "(" + _sid(rows[-1]["message_id"])
    return pending, last


def dead_task_id(model: type[Task] | type[TrajectoryGroup], payload: bytes) -> str | None:
    """The task id of a dead letter's payload: from the validated model, or, for a payload the schema
    refused (a group whose token ids leave its task's vocabulary, say), from its envelope's data as
    written; None when neither holds a task id."""
    try:
        value = decode(model, payload)
        return value.task_id if isinstance(value, Task) else value.task.task_id
    except SchemaError:
        pass
    try:
        data = read_envelope(model, payload)
    except SchemaError:
        return None
    if model is TrajectoryGroup:
        data = data.get("task") if isinstance(data, dict) else None
    tid = data.get("task_id") if isinstance(data, dict) else None
    ok = isinstance(tid, str) and len(tid) <= 256 and re.fullmatch(TASK_ID_PATTERN, tid) is not None
    return tid if ok else None


def _records(client: redis_py.Redis, key: str, group: str, model: type) -> list[StreamRecord]:
    pending, last = _group_state(client, key, group)
    out = []
    for entry_id, fields in _entries(client, key):
        try:
            value = decode(model, fields.get(PAYLOAD_FIELD, b""))
        except SchemaError:
            continue  # a malformed entry is dead-lettered by its reader, and counted there
        task = value if isinstance(value, Task) else value.task
        if last is None or _id_key(entry_id) > _id_key(last):
            state = "undelivered"
        else:
            state = "pending" if entry_id in pending else "acked"
        out.append(StreamRecord(entry_id, task.task_id, state,
                                None if isinstance(value, Task) else value.policy_version))
    return out


def read_streams(url: str, run: str, *, timeout_s: float = REDIS_TIMEOUT_S,
                 ) -> tuple[list[StreamRecord], list[StreamRecord], list[DeadRecord], int | None]:
    """The run's tasks, trajectories and dead streams, and the announced weight version; a Redis that does
    not connect or answer within `timeout_s` raises `redis.TimeoutError` (or `ConnectionError`)."""
    keys = StreamKeys(run)
    client = redis_py.Redis.from_url(url, decode_responses=False, socket_timeout=timeout_s,
                                     socket_connect_timeout=timeout_s)
    try:
        tasks = _records(client, keys.tasks, TASKS_GROUP, Task)
        groups = _records(client, keys.trajectories, TRAJECTORIES_GROUP, TrajectoryGroup)
        dead = []
        for _id, f in _entries(client, keys.dead):
            source = _sid(f.get(b"source", b""))
            model = Task if source == keys.tasks else TrajectoryGroup
            tid = dead_task_id(model, f.get(b"payload", b""))
            dead.append(DeadRecord(source, tid, _sid(f.get(b"reason", b""))))
        announced = None
        with contextlib.suppress(ValueError, TypeError):  # the hash's plain `version` field (`searchr1.weightsync.announce`)
            announced = int(client.hget(keys.weights, "version") or b"")
    finally:
        client.close()
    return tasks, groups, dead, announced


def read_archive(directory: Path) -> list[TrainedRow]:
    """One row per archived group (an empty or missing archive: none)."""
    from searchr1.learner.tools.archive import ArchiveError, read

    try:
        table = read(directory, columns=["step", "task_id", "worker_id", "policy_version", "index", "segments"])
    except ArchiveError:
        return []
    firsts: dict[tuple[int, int, str], dict] = {}
    resumed: Counter[tuple[int, int, str]] = Counter()
    for r in table.to_pylist():
        key = (r["step"], r["part"], r["task_id"])
        if r["index"] == 0:
            firsts[key] = r
        resumed[key] += len(r["segments"] or []) > 1
    return [TrainedRow(r["step"], r["part"], r["task_id"], r["worker_id"], r["policy_version"], resumed[key])
            for key, r in firsts.items()]


def read_checkpoint(directory: Path) -> CheckpointRecord | None:
    """The latest complete checkpoint's step, version and consumed task ids (its `state.json` only)."""
    if not directory.is_dir():
        return None
    done = sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith("step")
                  and (p / "state.json").is_file())
    if not done:
        return None
    meta = json.loads((done[-1] / "state.json").read_text())
    return CheckpointRecord(int(meta["step"]), int(meta["version"]), frozenset(decode_consumed(meta)))


def read_logs(log_dir: Path) -> tuple[list[int], dict[str, str], dict[str, int]]:
    """From `RUN_DIR/logs`: the learner's resume steps, its drop reasons by task id, and each rollout
    worker's last loaded weight version (0 when it never loaded one: it serves the initial weights)."""
    resumes: list[int] = []
    drops: dict[str, str] = {}
    learner = log_dir / "learner.log"
    if learner.is_file():
        for line in learner.read_text(errors="replace").splitlines():
            if m := _RESUMED.search(line):
                resumes.append(int(m.group(1)))
            elif m := _DROPPED.search(line):
                drops[m.group(1)] = m.group(2).strip()
    workers: dict[str, int] = {}
    for path in sorted(log_dir.glob("rollout-*.log")):
        version = 0
        for line in path.read_text(errors="replace").splitlines():
            if m := _LOADED.search(line):
                version = int(m.group(1))
        workers[path.stem] = version
    return resumes, drops, workers


def run_identity(run_dir: Path) -> tuple[str | None, str | None]:
    """The run name `searchr1 up` gave its processes (`RUN_DIR/processes.json`), if recorded, and the Redis URL
    when a command template put it on the learner's command line (`up`'s own give it by environment: None).
    The run is read from the learner's `--run` when a template put it there, else from a rollout worker's
    (`up` gives the learner its run by environment: under torchrun `--run` is torchrun's own option)."""
    table_path = run_dir / "processes.json"
    if not table_path.is_file():
        return None, None
    table = json.loads(table_path.read_text())

    def flag(argv: list[str], name: str) -> str | None:
        return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None

    learner = table.get("learner", {}).get("argv", [])
    others = [p.get("argv", []) for name, p in sorted(table.items()) if name.startswith("rollout")]
    run = next((r for r in (flag(a, "--run") for a in [learner, *others]) if r is not None), None)
    return run, flag(learner, "--redis")


@contextlib.contextmanager
def aof_redis(aof_dir: Path, timeout_s: float = 30.0) -> Iterator[str]:
    """A redis-server on a copy of `aof_dir` (a stopped run's append-only file); yields its URL."""
    from searchr1.core.redis_server import find_redis_server
    from searchr1.core.servers import free_port

    if not any(aof_dir.glob("*.aof")) and not (aof_dir / "appendonlydir").is_dir():
        raise FileNotFoundError(f"no append-only file in {aof_dir}")
    with tempfile.TemporaryDirectory(prefix="searchr1-audit-") as tmp:
        data = Path(tmp) / "redis"
        shutil.copytree(aof_dir, data)
        port = free_port("127.0.0.1")
        proc = subprocess.Popen([find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "yes", "--dir", str(data), "--protected-mode", "no"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        try:
            client = redis_py.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    client.ping()
                    break
                except (redis_py.ConnectionError, redis_py.BusyLoadingError):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server on the copy of {aof_dir} did not start") from None
                    time.sleep(0.1)
            client.close()
            yield url
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
