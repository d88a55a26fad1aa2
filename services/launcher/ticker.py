"""The status line's loop while a launch runs: collect a `StatusSnapshot` every `refresh_s`, render it,
hand it to the live view, and on a plain console print it when `PlainCadence` says."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from searchr1.core.aio import stop_task
from searchr1.launcher.logs import LogMux
from searchr1.launcher.status import StatusCollector, render_status
from searchr1.launcher.view import LiveView, PlainCadence


class StatusTicker:
    """Owns the status task; `suffix()` adds the supervisor's own facts (the restarts) to each line."""

    def __init__(self, collector: StatusCollector, view: LiveView, mux: LogMux, cadence: PlainCadence,
                 refresh_s: float, suffix: Callable[[], str]) -> None:
        self.collector = collector
        self.view = view
        self.mux = mux
        self.cadence = cadence
        self.refresh_s = refresh_s
        self.suffix = suffix
        self.last: str | None = None
        """The last rendered status line (printed once more when the run ends)."""
        self._task: asyncio.Task | None = None
        self._halt = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        failing: str | None = None
        while not self._halt.is_set():  # a cancel can be lost in a Redis call (core.aio)
            try:
                await self._tick()
            except Exception as exc:  # noqa: BLE001 - the status line never ends the run: said once, tried again
                why = f"{type(exc).__name__}: {exc}"
                if why != failing:
                    self.mux.say(f"status line failed ({why}); trying again every {self.refresh_s:.0f}s", "yellow")
                failing = why
            else:
                failing = None
            await asyncio.sleep(self.refresh_s)

    async def _tick(self) -> None:
        try:
            async with asyncio.timeout(max(2.0, self.refresh_s)):
                snap = await self.collector.collect()
        except (TimeoutError, OSError):
            snap = None
        if snap is not None:
            line = render_status(snap) + self.suffix()
            self.last = line
            self.view.update(snap.step, line)
            if not self.view.active and self.cadence.due(snap.step, time.monotonic()):
                progress = self.view.plain_progress(snap.step)
                self.mux.say(f"status: {line}" + (f"  [{progress}]" if progress else ""), "bold")

    async def stop(self) -> None:
        """Stop the loop (if it runs) and print the last line once more."""
        if self._task is None:
            return
        self._halt.set()
        await stop_task(self._task, timeout=10.0)
        self._task = None
        if self.last:
            self.mux.say(f"final status: {self.last}", "bold")
