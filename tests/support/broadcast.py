"""A weight-broadcast receiver running in a thread, as a rollout engine's worker runs one: it joins the
group, receives one version and records the tensors and the digest (or the error) in `into`."""

from __future__ import annotations

import threading

from searchr1.weightsync import Receiver
from searchr1.weightsync.broadcast import GroupAddress


def receive_in_thread(rx: Receiver, addr: GroupAddress, version: int, into: dict) -> threading.Thread:
    """Start `rx` receiving `version` from the group at `addr`; `into` gets `tensors` and `digest`, or
    `error`."""
    def run():
        try:
            rx.join(addr)
            into["tensors"] = {n: t.clone() for n, t in rx.receive(version)}
            into["digest"] = rx.last_digest
        except Exception as exc:  # noqa: BLE001 - reported to the test
            into["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t
