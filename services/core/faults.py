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

`rollout.skip_reload` does not kill either: the rollout weight loader skips the engine's reload once but
records the new version as loaded — a reload that failed silently, for the learner's desync screen to
catch (`learner/algo/desync.py`).

`rollout.poison_group` does not kill: `poisoned(group)` returns the group with its first token id
pushed far past any vocabulary (schema-valid, untrainable), once — a worker sending poison that passes
the schema, for the learner to dead-letter alone.
"""

from __future__ import annotations

import os
import signal
import time

from searchr1.core.schemas import TrajectoryGroup

ENV_POINT = "SEARCHR1_FAULT_POINT"
ENV_MARKER = "SEARCHR1_FAULT_MARKER"

_reached: dict[str, int] = {}


def fault_fires(name: str) -> bool:
    """True when `SEARCHR1_FAULT_POINT` asks for a fault here, now (see the module docstring)."""
    wanted = os.environ.get(ENV_POINT)
    if not wanted:
        return False
    point, _, nth = wanted.partition("@")
    if point != name:
        return False
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] != (int(nth) if nth else 1):
        return False
    marker = os.environ.get(ENV_MARKER)
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(f"{name} pid {os.getpid()} at {time.time()!r}\n")
            f.flush()
            os.fsync(f.fileno())
    return True


def fault_point(name: str) -> None:
    """SIGKILL this process here if `SEARCHR1_FAULT_POINT` asks for it (see the module docstring)."""
    if fault_fires(name):
        os.kill(os.getpid(), signal.SIGKILL)


POISON_TOKEN_ID = 2**30
"""The token id `poisoned` writes: past any real vocabulary, within the schema."""


def poisoned(group: TrajectoryGroup) -> TrajectoryGroup:
    """`group` with its first trajectory's first response token set to
    `POISON_TOKEN_ID` when the `rollout.poison_group` point fires, else `group` itself."""
    if not fault_fires("rollout.poison_group"):
        return group
    first = group.trajectories[0]
    bad = first.model_copy(update={"response_ids": [POISON_TOKEN_ID, *first.response_ids[1:]]})
    return group.model_copy(update={"trajectories": [bad, *group.trajectories[1:]]})
