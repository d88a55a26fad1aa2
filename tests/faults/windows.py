"""Faults that are windows, not deaths, for the fault suite: a network partition that black-holes one
process's Redis connection (`tests/support/blackhole.py`, run in a thread, between the process and Redis),
Redis refusing writes (`OOM` at a tiny `maxmemory`, `MISCONF` after a failed background save), a second
learner started against the running run, and groups injected into the trajectories stream.

A window is measured like a kill: from its start to the target healthy again (its `/readyz` 200 after the
window ended) and to the next training step logged after the window ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import redis

from searchr1.core.schemas import TrajectoryGroup, decode, encode
from searchr1.streams import PAYLOAD_FIELD, StreamKeys
from tests.faults.harness import SEARCHR1, Fault, FaultRun
from tests.support.blackhole import BlackholeProxy


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(rng: random.Random) -> int:
    """A prefix P such that ports P0 and P1 are free: worker i's proxy listens on f"{P}{i}" (the launcher's
    command templates substitute `{worker_index}`, so one template gives each worker its own port)."""
    for _ in range(200):
        prefix = rng.randrange(2000, 6000)
        if port_is_free(prefix * 10) and port_is_free(prefix * 10 + 1):
            return prefix
    raise AssertionError("no two free ports")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadedProxy:
    """A `BlackholeProxy` on a fixed loopback port, run by its own event loop in a thread."""

    def __init__(self, target_port: int, port: int) -> None:
        self.proxy = BlackholeProxy("127.0.0.1", target_port, port=port)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(10)

    def blackhole(self) -> None:
        self.loop.call_soon_threadsafe(self.proxy.blackhole)

    def restore(self) -> None:
        self.loop.call_soon_threadsafe(self.proxy.restore)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def argv_of(run: FaultRun, name: str) -> list[str]:
    return json.loads((run.run_dir / "processes.json").read_text())[name]["argv"]


def metrics_port(run: FaultRun, name: str) -> int:
    argv = argv_of(run, name)
    return int(argv[argv.index("--metrics-port") + 1])


def readyz(port: int) -> int:
    """The status of `/readyz` on a metrics port (0: no answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def redis_password(run: FaultRun) -> str | None:
    """The run's Redis password, from the learner's environment (`/proc/PID/environ`, same user): the
    launcher gives it to the services only, never on a command line."""
    from urllib.parse import urlparse

    try:
        raw = Path(f"/proc/{run.pid('learner')}/environ").read_bytes()
    except (OSError, KeyError, ValueError):
        return None
    for item in raw.split(b"\0"):
        if item.startswith(b"LEARNER_REDIS__URL="):
            return urlparse(item.split(b"=", 1)[1].decode()).password
    return None


def redis_client(run: FaultRun) -> redis.Redis:
    """A client of the run's Redis (`up` starts it with a generated password)."""
    argv = argv_of(run, "redis")
    return redis.Redis(port=int(argv[argv.index("--port") + 1]), password=redis_password(run), socket_timeout=10)


def window(run: FaultRun, target: str, how: str, begin: Callable[[], None], end: Callable[[], None], *,
           after_step: int, hold_s: float, watch: str | None = None) -> Fault:
    """Once the learner logged `after_step`: `begin()`, hold for `hold_s` (polling `watch`'s `/readyz`),
    `end()`; then wait for `watch` ready again and the next step."""
    run.wait(lambda: run.steps() >= after_step, 900, f"step {after_step}")
    port = metrics_port(run, watch) if watch else None
    fault = Fault(target, how, not_ready_seen=False if watch else None)
    fault.killed_at = time.time()
    begin()
    try:
        while time.time() - fault.killed_at < hold_s:
            if port is not None and readyz(port) != 200:
                fault.not_ready_seen = True
            time.sleep(0.5)
    finally:
        end()
    fault.healed_after_s = time.time() - fault.killed_at
    steps_then = run.steps()
    run.faults.append(fault)
    if port is not None:
        run.wait(lambda: readyz(port) == 200, 300, f"{watch} ready again")
    fault.healthy_after_s = time.time() - fault.killed_at
    if steps_then < run.target_steps:
        run.wait(lambda: run.steps() > steps_then or run.proc.poll() is not None, 600, "the next step")
        fault.next_step_after_s = time.time() - fault.killed_at
    return fault


def refuse_writes(r: redis.Redis, kind: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """`begin`/`end` of a window in which Redis refuses writes: `oom` (`maxmemory` 1 byte, `noeviction`)
    or `misconf` (a background save that fails — its directory unwritable — with
    `stop-writes-on-bgsave-error yes`)."""
    if kind == "oom":
        def begin() -> None:
            r.config_set("maxmemory-policy", "noeviction")
            r.config_set("maxmemory", 1)

        def end() -> None:
            r.config_set("maxmemory", 0)
        return begin, end
    saved_dir = r.config_get("dir")["dir"]

    def begin_misconf() -> None:
        r.config_set("stop-writes-on-bgsave-error", "yes")
        r.config_set("save", "3600 1")
        r.config_set("dir", "/proc")  # no file can be created there, not even by root
        r.bgsave()
        deadline = time.monotonic() + 30
        while r.info("persistence")["rdb_last_bgsave_status"] != "err":
            assert time.monotonic() < deadline, "the background save did not fail"
            time.sleep(0.1)

    def end_misconf() -> None:
        r.config_set("dir", saved_dir)
        r.config_set("save", "")  # as the launcher starts it: without a saving policy no failed save stops writes
    return begin_misconf, end_misconf


def inject_copy(r: redis.Redis, run_name: str, change: Callable[[TrajectoryGroup], TrajectoryGroup]) -> str:
    """XADD to the trajectories stream a changed copy of its newest group (schema-valid, current policy
    version); returns the copy's task id."""
    keys = StreamKeys(run_name)
    [(_, fields)] = r.xrevrange(keys.trajectories, count=1)
    group = change(decode(TrajectoryGroup, fields[PAYLOAD_FIELD]))
    r.xadd(keys.trajectories, {PAYLOAD_FIELD: encode(group)})
    return group.task.task_id


def second_learner(run: FaultRun, config, redis_url: str) -> subprocess.Popen:
    """`searchr1 train` against the running run, writing (if it ever could) under its own directory; its
    output goes to `second-learner.out`, its errors to `second-learner.err`."""
    own = run.root / "second-learner"
    env = {"LEARNER_LOG_DIR": str(own / "log"), "LEARNER_CHECKPOINT__DIR": str(own / "checkpoints"),
           "LEARNER_WEIGHTS__DIR": str(own / "weights"), "LEARNER_ARCHIVE__DIR": str(own / "archive"),
           "LEARNER_LEASE_TTL_MS": "2000", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([*SEARCHR1, "train", "--config", str(config), "--redis", redis_url, "--run", "faults",
                             "--metrics-port", str(free_port())],
                            stdout=(run.root / "second-learner.out").open("w"),
                            stderr=(run.root / "second-learner.err").open("w"), env={**os.environ, **env}, cwd=run.root)
