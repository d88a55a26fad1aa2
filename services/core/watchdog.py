"""Liveness that means progress: a service beats a `Watchdog` when it makes progress — the learner when it
trains a step, a rollout worker on every pass of its loop — and once no beat came for `stall_s` the
watchdog is stalled: `/healthz` answers 503 (`alive()`), and a service that runs `guard()` stops with
`Stalled`, naming what it was doing (`describe()`), so the launcher or Kubernetes restarts it instead of a
healthy-looking process holding its work forever.

Waiting is not progress: the learner does not beat while it waits for groups, so a step that cannot fill
ends in a stop that says so, not in a wait with green probes. Some waits are excused, though:

- while `excused()` holds (Redis is away and every call waits for it) the watchdog stays alive, and the
  bound restarts when the outage ends;
- inside `with watchdog.waiting():` (a learner rank other than 0 waiting for rank 0's next step, which
  rank 0's watchdog bounds) likewise;
- inside `with watchdog.progressing(measure):` (a checkpoint being written) every look at the watchdog
  beats it when `measure()` (the bytes written so far) grew since the last look: a slow save that keeps
  writing is progress, one that stopped writing is not.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("searchr1.core.watchdog")


class Stalled(RuntimeError):
    """A watchdog saw no progress for its bound (`Watchdog.guard`)."""


class Watchdog:
    """`beat()` from the loop; `alive()` from the probe's thread; `guard()` as a supervised task (see the
    module docstring)."""

    def __init__(self, name: str, stall_s: float, *, excused: Callable[[], bool] = lambda: False,
                 describe: Callable[[], str] = lambda: "", clock: Callable[[], float] = time.monotonic) -> None:
        if stall_s <= 0:
            raise ValueError("stall_s must be positive")
        self.name = name
        self.stall_s = stall_s
        self.excused = excused
        self.describe = describe
        """What the service is doing (for the stall's message): the learner's stage and what it waits for."""
        self._clock = clock
        self._last = clock()
        self._reported = False
        self._waits = 0
        self._measures: list[list] = []  # [measure, last value, last look] of each `progressing` stage
        self._lock = threading.Lock()

    def beat(self) -> None:
        self._last = self._clock()
        self._reported = False

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """An excused wait (see the module docstring); ends with a beat."""
        self._waits += 1
        try:
            yield
        finally:
            self._waits -= 1
            self.beat()

    @contextmanager
    def progressing(self, measure: Callable[[], int], every_s: float = 1.0) -> Iterator[None]:
        """A stage whose progress is a count that grows (see the module docstring); `measure` is looked at
        at most every `every_s` (it may read the disk), from whichever thread looks at the watchdog."""
        entry = [measure, measure(), self._clock(), every_s]
        with self._lock:
            self._measures.append(entry)
        try:
            yield
        finally:
            with self._lock:
                self._measures.remove(entry)

    def _look(self) -> None:
        with self._lock:
            measures = list(self._measures)
        now = self._clock()
        for entry in measures:
            measure, last, at, every_s = entry
            if now - at < every_s:
                continue
            entry[2] = now
            try:
                value = measure()
            except OSError:
                continue
            if value > last:
                entry[1] = value
                self.beat()

    def stalled_for(self) -> float:
        """Seconds since the last beat."""
        self._look()
        return self._clock() - self._last

    def alive(self) -> bool:
        if self._waits or self.excused():
            self._last = self._clock()  # the outage's end starts a fresh bound
            return True
        stalled = self.stalled_for()
        if stalled < self.stall_s:
            return True
        if not self._reported:
            self._reported = True
            log.error("%s", self.message(stalled))
        return False

    def message(self, stalled: float | None = None) -> str:
        """The stall, in one line: how long, the bound, and what the service was doing."""
        stalled = self.stalled_for() if stalled is None else stalled
        doing = self.describe()
        return (f"{self.name}: no progress for {stalled:.0f} s (stall_timeout_s {self.stall_s:.0f})"
                + (f": {doing}" if doing else ""))

    async def guard(self, every_s: float = 1.0) -> None:
        """Look every `every_s`; raise `Stalled` once not `alive()` (run it as a supervised task: the service
        then stops with the message, `searchr1.core.supervise`)."""
        while True:
            await asyncio.sleep(every_s)
            if not self.alive():
                raise Stalled(self.message())
