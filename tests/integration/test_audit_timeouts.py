"""The audit gives up on a Redis that accepts connections and never answers (a black-holed link), with
a Redis timeout error, instead of waiting forever."""

from __future__ import annotations

import socket
import threading

import pytest
import redis as redis_py

from searchr1.learner.tools.audit_sources import read_streams


def test_a_silent_redis_times_out():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the handshake; nothing ever answers
    url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
    outcome: list[BaseException | None] = []

    def audit() -> None:
        try:
            read_streams(url, "run", timeout_s=0.5)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=audit, daemon=True)
    worker.start()
    worker.join(60)  # a liveness bound on the test only
    silent.close()
    assert outcome, "the audit still waits on a Redis that never answers"
    with pytest.raises(redis_py.TimeoutError):
        raise outcome[0] if outcome[0] else AssertionError("no error")
