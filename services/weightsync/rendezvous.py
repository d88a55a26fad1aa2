"""Who is in a broadcast generation (`broadcast.py`): the receivers that joined it before the learner
closed it, counted in the group's store, so a generation forms from the receivers that are alive rather
than waiting for every receiver the run was configured with.

Per generation `g` the store holds a counter (`next_rank`) and, once the learner closes it, the world
size (`world`); one counter (`waiting`) is shared by every generation:

- a receiver joins by adding 1 to `next_rank`: the value returned is its rank. A rank past the configured
  receivers means the group is full, a rank at or past `CLOSED` that the learner already closed it; either
  way the receiver is refused, adds 1 to `waiting` and catches up from a snapshot;
- the learner waits until every configured receiver has joined or its wait ends (`timeout_s` for the
  first generation, `join_window_s` for the ones after), then closes the generation by adding `CLOSED`
  to `next_rank` — one atomic step, so a receiver either counted before it (a member) or sees the
  generation closed — and writes `world` (members + 1); members read it and form the group at that size;
- while a generation has fewer members than configured receivers, the learner reads `waiting` before
  each version: a receiver that was refused since the generation closed makes the learner start the next
  generation, which that receiver joins.

Blocking calls on a `TCPStore`: the learner and the receivers run them in a thread.
"""

from __future__ import annotations

import time
from typing import Any

CLOSED = 1 << 40
"""Added to a generation's `next_rank` when the learner closes it."""
WAITING = "searchr1/weights/waiting"
"""How many receivers were refused by a generation (full or closed) and wait for the next one."""
_POLL_S = 0.01


def _key(generation: int, name: str) -> str:
    return f"searchr1/weights/{generation}/{name}"


class Refused(RuntimeError):
    """The generation did not take this receiver (full, or closed before it joined)."""


def close_generation(store: Any, generation: int, receivers: int, wait_s: float) -> tuple[int, int]:
    """The learner's side: wait at most `wait_s` for `receivers` to join `generation`, then close it.
    Returns (members, the `waiting` count read just before closing)."""
    deadline = time.monotonic() + wait_s
    while int(store.add(_key(generation, "next_rank"), 0)) < receivers and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    waiting = int(store.add(WAITING, 0))  # read before closing: every refusal by this generation comes after
    members = min(int(store.add(_key(generation, "next_rank"), CLOSED)) - CLOSED, receivers)
    store.set(_key(generation, "world"), str(members + 1))
    return members, waiting


def join_generation(store: Any, generation: int, receivers: int) -> tuple[int, int]:
    """A receiver's side: take a rank in `generation` and wait for the learner to close it (as long as the
    store's timeout). Returns (rank, world size); `Refused` when the generation is full or closed."""
    rank = int(store.add(_key(generation, "next_rank"), 1))
    if rank >= CLOSED or rank > receivers:
        store.add(WAITING, 1)
        why = "closed before this receiver joined" if rank >= CLOSED else f"full ({receivers} receivers)"
        raise Refused(f"weight group generation {generation} is {why}")
    world = int(store.get(_key(generation, "world")))
    return rank, world


def someone_waits(store: Any, seen: int) -> bool:
    """Whether a receiver was refused since the learner read `waiting` as `seen`."""
    return int(store.add(WAITING, 0)) > seen
