"""Checkpoints by fencing token (`searchr1.streams.Lease`): which ones a learner may load, and whether it may
still write one.

A learner that takes a run over records, in `fences.json` beside the checkpoints, its token and the step it
resumed from (its *takeover*). A checkpoint written with token `t` at step `s` is stale when a learner with
a newer token `T > t` took over from a step before `s`: the older learner wrote it after it had lost the
run (a partition, a lost lease key), and it is never loaded. Among the checkpoints that are not stale and
verify, the loader prefers the highest token, then the highest step. A learner whose token is older than a
recorded takeover refuses to write a checkpoint at all; one that finds a checkpoint or a takeover with a
newer token than its own is fenced off (`LeaseLost`).

The record is a small JSON object `{token: step}` replaced atomically (temporary file, fsync, rename);
only a learner holding the run's lease writes it, once, at start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FENCES = "fences.json"


def read_takeovers(root: Path) -> dict[int, int]:
    """{token: step it resumed from} of every learner that took the run over ({} when none)."""
    try:
        raw = json.loads((Path(root) / FENCES).read_text())
    except FileNotFoundError:
        return {}
    return {int(k): int(v) for k, v in raw.items()}


def record_takeover(root: Path, token: int, step: int) -> None:
    """Record that the learner with `token` resumed from `step` (durably, replacing the file)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    takeovers = read_takeovers(root)
    takeovers[token] = step
    tmp = root / f".{FENCES}.{token}"
    with tmp.open("w") as f:
        json.dump({str(k): v for k, v in sorted(takeovers.items())}, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(root / FENCES)


def stale(fence: int, step: int, takeovers: dict[int, int]) -> int | None:
    """The newer token that took over before `step`, making a checkpoint (`fence`, `step`) stale; None when
    it is not stale."""
    for token, resumed in sorted(takeovers.items()):
        if token > fence and step > resumed:
            return token
    return None


def newest(takeovers: dict[int, int]) -> int:
    """The newest token that took the run over (0: none)."""
    return max(takeovers, default=0)
