"""The live bottom of the console while a launch runs: the stage, a progress bar with ETA (rich), and the
status line. Log lines print above it; it is transient, so a finished run leaves only those lines.

On a terminal it redraws in place (`rich.live.Live`). Elsewhere (a pipe, CI) it draws nothing and the
supervisor prints the status line as a plain line instead when `PlainCadence` says (every
`plain_every_percent` of the run's steps, else every `plain_interval_s`), with `progress_text`'s step
count and ETA after it. `eta_s` and `progress_text` are pure.
"""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


def eta_s(step: float, total: float, seconds_per_step: float | None) -> float | None:
    """Seconds left at `seconds_per_step` (None when the pace is unknown or no step is done yet)."""
    if seconds_per_step is None or seconds_per_step <= 0 or step <= 0 or total <= 0:
        return None
    return max(0.0, total - step) * seconds_per_step


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def progress_text(step: float | None, total: int | None, seconds_per_step: float | None) -> str:
    """`step 12/150 (8%) · ETA 4:10` — the plain-console form of the progress bar ('' when nothing is known)."""
    if step is None or not total:
        return ""
    text = f"step {int(step)}/{total} ({100 * min(step, total) / total:.0f}%)"
    eta = eta_s(step, total, seconds_per_step)
    return text if eta is None else f"{text} · ETA {_clock(eta)}"


class StepPace:
    """Seconds per learner step, timed from the first step change seen: the start-up and the wait for the
    first step (vLLM start-up, the first rollout) do not count."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._anchor: tuple[float, float] | None = None
        self.seconds_per_step: float | None = None

    def observe(self, step: float | None, now: float | None = None) -> None:
        if step is None:
            return
        now = time.monotonic() if now is None else now
        if self._last is not None and step < self._last:  # a restart: measure afresh
            self._anchor, self.seconds_per_step = None, None
        elif self._last is not None and step > self._last:
            if self._anchor is None:
                self._anchor = (step, now)
            else:
                self.seconds_per_step = (now - self._anchor[1]) / (step - self._anchor[0])
        self._last = step


class PlainCadence:
    """When a plain (non-terminal) console gets the next status line: each time training advances by
    `every_percent` of `total_steps` (so a run prints about 100/`every_percent` lines however long it takes),
    or, with no step total or `every_percent` 0, every `interval_s` seconds."""

    def __init__(self, interval_s: float, every_percent: float, total_steps: int | None) -> None:
        self.interval_s = interval_s
        self.every = total_steps * every_percent / 100 if total_steps and every_percent > 0 else None
        self._last_t: float | None = None
        self._last_step: float | None = None

    def due(self, step: float | None, now: float) -> bool:
        if self.every is None or step is None:
            due = self._last_t is None or now - self._last_t >= self.interval_s
        else:
            due = self._last_step is None or step - self._last_step >= self.every
        if due:
            self._last_t, self._last_step = now, step
        return due


class LiveView:
    """Stage, progress bar and status line, redrawn in place on a terminal (a no-op elsewhere)."""

    def __init__(self, console: Console, title: str, total_steps: int | None) -> None:
        self.console = console
        self.title = title
        self.total_steps = total_steps
        self.pace = StepPace()
        self._progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=console, auto_refresh=False, speed_estimate_period=3600.0)
        self._task = self._progress.add_task(title, total=None)
        self._status = Text("")
        self._live: Live | None = None

    @property
    def active(self) -> bool:
        return self._live is not None

    def start(self) -> None:
        if self.console.is_terminal and self._live is None:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def phase(self, text: str) -> None:
        """What is happening now (`starting rollout-0`, `training`), shown after the title."""
        self._progress.update(self._task, description=f"{self.title} · {text}")
        self._refresh()

    def update(self, step: float | None, status_line: str) -> None:
        """A new status snapshot: move the bar to `step` (of `total_steps`) and show the status line."""
        self.pace.observe(step)
        if step is not None and self.total_steps:
            self._progress.update(self._task, total=self.total_steps, completed=min(step, self.total_steps))
        self._status = Text(status_line, style="bold")
        self._refresh()

    def plain_progress(self, step: float | None) -> str:
        return progress_text(step, self.total_steps, self.pace.seconds_per_step)

    def _render(self) -> Group:
        return Group(self._progress, self._status)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
