"""Fault points for the fault-injection suite (tests/faults, docs/reliability.md "Fault injection"): named
places in the services' loops where a test makes a process fail on purpose, at the worst moment, which a
kill from outside hits only by chance.

A component with a fault point takes a `Faults` hook (`NO_FAULTS`, which never fires, by default) and
asks it at the point: `kill_at(name)` SIGKILLs the process there, `fires(name)` answers whether the
fault happens now, `poisoned(group)` returns a poisoned group. Tests in one process pass an armed
`FaultPoints`; a process the fault suite starts is armed once, at its command's entry, from its
environment (`faults_from_env`: `SEARCHR1_FAULT_POINT` = `name` or `name@n`, the n-th time the process
reaches the point, default the first; `SEARCHR1_FAULT_MARKER` = a path). Nothing on a loop's path reads
the environment; production processes run with `NO_FAULTS`.

With a marker the fault happens once across restarts and processes: the first to get there creates the
file (exclusively, with the point and the time), and a process that finds it already there carries on —
a restarted process does not kill itself again.

The points:

- `learner.after_archive`: a step trained and archived, not yet checkpointed nor acked (kills);
- `learner.after_checkpoint`: checkpointed, its groups not yet acked (kills);
- `checkpoint.before_seal`: a checkpoint's files written, not yet fsynced, manifested nor renamed: a torn
  checkpoint (kills);
- `rollout.after_publish`: a group published to the trajectories stream, its task not yet acked (kills);
- `rollout.skip_reload`: the weight loader skips the engine's reload once but records the new version as
  loaded — a reload that failed silently, for the learner's desync screen to catch
  (`learner/algo/desync.py`);
- `rollout.poison_group`: the worker publishes one group with its first token id pushed far past any
  vocabulary (schema-valid, untrainable), for the learner to dead-letter alone;
- `rollout.poison_task` (keyed by task id): the worker fails the task on every delivery, as on a question
  that crashes its engine, so the tasks stream dead-letters it after `max_deliveries`;
- `checkpoint.slow_write` (a pause): the checkpointer waits before each file of a checkpoint, a save slower
  than the learner's stall bound that keeps writing.

A long run (the soak) turns faults on and off while the processes run instead: `FaultSwitches`, armed
from `SEARCHR1_FAULT_SWITCHES` = a directory, fires at a point while a file of that name is in the
directory; the file holds the pause in seconds (`checkpoint.slow_write`) or the keys it fires for, one a
line (`rollout.poison_task`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from searchr1.core.schemas import TrajectoryGroup

ENV_POINT = "SEARCHR1_FAULT_POINT"
ENV_MARKER = "SEARCHR1_FAULT_MARKER"
ENV_SWITCHES = "SEARCHR1_FAULT_SWITCHES"
POISON_TOKEN_ID = 2**30
"""The token id `poisoned` writes: past any real vocabulary, within the schema."""


class Faults:
    """The hook a component asks at its fault points. This base is the null hook: no point ever fires."""

    def fires(self, name: str) -> bool:
        """True when the fault at point `name` happens here, now."""
        return False

    def fires_for(self, name: str, key: str) -> bool:
        """True when the fault at point `name` happens for `key` (a task id)."""
        return False

    def pause_s(self, name: str) -> float:
        """Seconds to pause at point `name` (0: none)."""
        return 0.0

    def pause_at(self, name: str) -> None:
        """Sleep here for `pause_s(name)` (blocking: called in a thread)."""
        seconds = self.pause_s(name)
        if seconds > 0:
            time.sleep(seconds)

    def kill_at(self, name: str) -> None:
        """SIGKILL this process here if the fault at point `name` fires."""
        if self.fires(name):
            os.kill(os.getpid(), signal.SIGKILL)

    def poisoned(self, group: TrajectoryGroup) -> TrajectoryGroup:
        """`group` with its first trajectory's first response token set to `POISON_TOKEN_ID` when the
        `rollout.poison_group` point fires, else `group` itself."""
        if not self.fires("rollout.poison_group"):
            return group
        first = group.trajectories[0]
        bad = first.model_copy(update={"response_ids": [POISON_TOKEN_ID, *first.response_ids[1:]]})
        return group.model_copy(update={"trajectories": [bad, *group.trajectories[1:]]})


NO_FAULTS = Faults()
"""The hook every production process runs with: stateless, never fires."""


@dataclass
class FaultPoints(Faults):
    """A hook armed at one point: `point` is `name` or `name@n` (the n-th time this hook is asked about
    `name`; default the first). With `marker`, the fault happens once across processes (see the module
    docstring)."""

    point: str
    marker: Path | None = None
    reached: dict[str, int] = field(default_factory=dict)
    """How often each point was asked about."""

    def fires(self, name: str) -> bool:
        point, _, nth = self.point.partition("@")
        if point != name:
            return False
        self.reached[name] = self.reached.get(name, 0) + 1
        if self.reached[name] != (int(nth) if nth else 1):
            return False
        if self.marker is not None:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(f"{name} pid {os.getpid()} at {time.time()!r}\n")
                f.flush()
                os.fsync(f.fileno())
        return True


@dataclass
class FaultSwitches(Faults):
    """A hook whose points are turned on and off from outside the process: a point fires while a file of
    its name is in `directory` (see the module docstring). Each look reads the directory."""

    directory: Path

    def _read(self, name: str) -> str | None:
        try:
            return (self.directory / name).read_text()
        except OSError:  # no such switch (or none readable): off
            return None

    def fires(self, name: str) -> bool:
        return self._read(name) is not None

    def fires_for(self, name: str, key: str) -> bool:
        text = self._read(name)
        return text is not None and key in text.split()

    def pause_s(self, name: str) -> float:
        text = self._read(name)
        try:
            return max(0.0, float(text)) if text and text.strip() else 0.0
        except ValueError:
            return 0.0


def faults_from_env(environ: Mapping[str, str] = os.environ) -> Faults:
    """The hook a process started by the fault suite is armed with (`SEARCHR1_FAULT_SWITCHES`, else
    `SEARCHR1_FAULT_POINT` and `SEARCHR1_FAULT_MARKER`), read once at its command's entry; `NO_FAULTS` when
    neither is set."""
    switches = environ.get(ENV_SWITCHES)
    if switches:
        return FaultSwitches(Path(switches))
    point = environ.get(ENV_POINT)
    if not point:
        return NO_FAULTS
    marker = environ.get(ENV_MARKER)
    return FaultPoints(point, Path(marker) if marker else None)
