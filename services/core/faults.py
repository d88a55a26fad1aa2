"""A test hook for the fault-injection suite (tests/faults, docs/reliability.md "Fault injection"): a
process kills itself with SIGKILL at a named point of its loop, once.

Off unless `SEARCHR1_FAULT_POINT` names the point: `name` or `name@n` (the n-th time this process reaches
it; default the first). With `SEARCHR1_FAULT_MARKER=path` the fault happens once across restarts and
processes: the first to get there creates the file (exclusively, with the point and the time), and a
process that finds it already there carries on — a restarted process does not kill itself again.

The points: `learner.after_archive` (a step trained and archived, not yet checkpointed nor acked),
`learner.after_checkpoint` (checkpointed, its groups not yet acked), `checkpoint.before_seal` (a
checkpoint's files written, not yet fsynced, manifested nor renamed: a torn checkpoint) and `rollout.after_publish` (a group published to the trajectories stream, its task not yet acked): the worst
moments to die, which a kill from outside hits only by chance. For tests only; never set in production.
"""

from __future__ import annotations

import os
import signal
import time

ENV_POINT = "SEARCHR1_FAULT_POINT"
ENV_MARKER = "SEARCHR1_FAULT_MARKER"

_reached: dict[str, int] = {}


def fault_point(name: str) -> None:
    """SIGKILL this process here if `SEARCHR1_FAULT_POINT` asks for it (see the module docstring)."""
    wanted = os.environ.get(ENV_POINT)
    if not wanted:
        return
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] != (int(nth) if nth else 1):
        return
    marker = os.environ.get(ENV_MARKER)
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(f"{name} pid {os.getpid()} at {time.time()!r}\n")
            f.flush()
            os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
