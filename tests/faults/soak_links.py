"""The soak's links and samples: each client's link (a chaos proxy, run with the others by one event loop in
a thread; `Links`) and what the soak records while it runs (`Sampler`: the steps logged, Redis memory, the
disk under the run directory, each process's RSS)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults import soak_curves as curves
from tests.faults.chaos_proxy import ChaosProxy


@dataclass
class Link:
    """One client→server path: the proxy every connection of that client goes through."""

    name: str
    proxy: ChaosProxy
    veth: str | None = None
    """The veth the link crosses (netns mode): a partition takes it down."""


class Links:
    """The proxies, run by one event loop in a thread; shaped, paused and resumed from the main thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="soak-links")
        self.thread.start()
        self.links: dict[str, Link] = {}

    def call(self, fn, *args):
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def add(self, name: str, proxy: ChaosProxy, veth: str | None = None) -> Link:
        asyncio.run_coroutine_threadsafe(proxy.start(), self.loop).result(10)
        self.links[name] = Link(name, proxy, veth)
        return self.links[name]

    def close(self) -> None:
        for link in self.links.values():
            asyncio.run_coroutine_threadsafe(link.proxy.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Sampler:
    """What the soak records while it runs (times in seconds since its start)."""

    t0: float
    step_times: list[float] = field(default_factory=list)
    steps: list[tuple[float, int]] = field(default_factory=list)
    redis: list[tuple[float, int]] = field(default_factory=list)
    disk: list[tuple[float, int]] = field(default_factory=list)
    rss: list[curves.RssSample] = field(default_factory=list)
    _offset: int = 0

    def now(self) -> float:
        return time.time() - self.t0

    def poll_steps(self, jsonl: Path) -> None:
        """New lines of the learner's step log, each one a step logged (a resumed learner logs the steps it
        retrains again: the count is of steps done, not of the step number)."""
        if not jsonl.is_file():
            return
        with jsonl.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        lines = data.count(b"\n")
        if lines:
            self._offset += data.rfind(b"\n") + 1
            t = self.now()
            self.step_times += [t] * lines
            self.steps.append((t, len(self.step_times)))


def disk_used(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def rss_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
