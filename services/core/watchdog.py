"""Liveness that means progress: a service's main loop beats a `Watchdog` on every pass, and `/healthz`
answers 503 once no beat came for `stall_s` — a loop hung on a stuck engine, a drain that never ends or a
blocked event loop — so the launcher or Kubernetes restarts the process instead of a healthy-looking
one holding its tasks forever. Waiting through a dependency outage is not a stall: while `excused()`
holds (e.g. Redis is away and every call waits for it), the watchdog stays alive and readiness says why.
Nor is a wait another process's watchdog bounds: inside `with watchdog.waiting():` (a learner rank other
than 0 waiting for rank 0's next step) it stays alive, and the bound restarts when the wait ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("searchr1.core.watchdog")


class Watchdog:
    """`beat()` from the loop; `alive()` from the probe's thread (see the module docstring)."""

    def __init__(self, name: str, stall_s: float, *, excused: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if stall_s <= 0:
            raise ValueError("stall_s must be positive")
        self.name = name
        self.stall_s = stall_s
        self.excused = excused
        self._clock = clock
        self._last = clock()
        self._reported = False
        self._waits = 0

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

    def stalled_for(self) -> float:
        """Seconds since the last beat."""
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
            log.error("%s: main loop made no progress for %.0f s (bound %.0f s): reporting not alive",
                      self.name, stalled, self.stall_s)
        return False
