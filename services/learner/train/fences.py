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
only a learner holding the run's lease writes it, once, at start. A record that cannot be read (empty, or
not such an object: a filesystem that lost the rename's data, a hand edit) is logged as an error naming
the file and read as no takeovers — the loader still prefers the highest token — and the next takeover
moves it aside (`fences.json.corrupt-<unix time>`) before writing a new one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

FENCES = "fences.json"
log = logging.getLogger("searchr1.learner")


class FencesUnreadable(ValueError):
    """`fences.json` exists and is not a `{token: step}` object of integers."""


def _parse(path: Path) -> dict[int, int]:
    """The takeovers in `path`; `FileNotFoundError` when it is missing, `FencesUnreadable` naming it when
    its content is not a record."""
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise FencesUnreadable(f"{path} is not UTF-8 text") from None
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError(f"a JSON {type(raw).__name__}, not an object")
        return {int(k): int(v) for k, v in raw.items()}
    except (ValueError, TypeError) as exc:
        what = "empty" if not text.strip() else f"not a {{token: step}} record ({exc})"
        raise FencesUnreadable(f"{path} is {what}") from None


def read_takeovers(root: Path) -> dict[int, int]:
    """{token: step it resumed from} of every learner that took the run over ({} when none, or when the
    record cannot be read: logged, naming the file)."""
    try:
        return _parse(Path(root) / FENCES)
    except FileNotFoundError:
        return {}
    except FencesUnreadable as exc:
        log.error("ignoring the record of takeovers: %s; checkpoints are chosen by token and step alone until a "
                  "learner's start writes a new record", exc)
        return {}


def highest_token(root: Path) -> int:
    """The highest fencing token recorded under the checkpoint root `root`: in `fences.json` and in every
    checkpoint's `state.json` (0: none). A learner's lease takes a token above it, so Redis losing its
    counter (data loss, a restore from an older copy) cannot hand out a token already used."""
    root = Path(root)
    if not root.is_dir():
        return 0
    tokens = list(read_takeovers(root))
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step"):
            try:
                tokens.append(int(json.loads((p / "state.json").read_text()).get("fence", 0)))
            except (OSError, ValueError, AttributeError, TypeError):
                continue  # unreadable: never loaded either
    return max(tokens, default=0)


def record_takeover(root: Path, token: int, step: int) -> None:
    """Record that the learner with `token` resumed from `step` (durably, replacing the file)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    try:
        takeovers = _parse(root / FENCES)
    except FileNotFoundError:
        takeovers = {}
    except FencesUnreadable as exc:
        aside = root / f"{FENCES}.corrupt-{int(time.time())}"
        (root / FENCES).replace(aside)
        log.error("%s; moved aside to %s, a new record started", exc, aside)
        takeovers = {}
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
