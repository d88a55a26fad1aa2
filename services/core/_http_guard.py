"""The connection guard of the HTTP servers (`searchr1.core.servers.HttpServer`): request heads that
time out, a bound on open connections that idle clients cannot hold, and logs that a flood cannot grow.

uvicorn times a connection out only between requests (`timeout_keep_alive`, armed after a response and
cancelled by any byte received), so a client that connects and sends nothing, or drips a request head a
byte at a time, holds its connection — a file descriptor — forever. Past the process's descriptor limit
every accept fails, the server answers nobody, and CPython's accept loop logs each failure with a traceback
(measured: 1,500 idle connections at a 1,024-descriptor limit shut the reward service out and wrote 129 MB
of log in 20 s). The guard wraps uvicorn's protocol class:

- **Head deadline.** A connection must complete each request head within `head_timeout_s` of being
  accepted, or of its previous response; bytes dripped in do not extend it. Past it the connection is
  closed. A request being answered (its head complete) is not timed here: the body's own limit is
  `searchr1.core._body_limit`'s.
- **Connection bound.** At most `max_connections` are open (by default 1,024, or half the descriptor
  limit when that is lower). A connection past the bound closes the one that has waited longest for a
  request head — an idle client's, never one whose request is being answered — so a client that sends its
  request at once is always served, however many idle connections others hold; when every open connection
  is busy with a request, the new one is closed.
- **Quiet logs.** What the guard closed is logged at most once a minute, as counts; the event loop's
  "socket.accept() out of system resource" error (descriptors exhausted by something else) at most once
  every 10 s, with how many were left out.

Departs from uvicorn's defaults; not a uvicorn setting (`limit_concurrency` answers 503 to requests past a
count, but only once their head has arrived, and keeps every connection open).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("searchr1.http")

DEFAULT_MAX_CONNECTIONS = 1024
"""Open connections one HTTP server allows (lowered to half the descriptor limit when that is lower)."""
DEFAULT_HEAD_TIMEOUT_S = 10.0
"""Seconds a connection has to send a complete request head (from its accept, or its previous response)."""
SUMMARY_EVERY_S = 60.0
"""Seconds between two log lines of what the guard closed."""
ACCEPT_ERROR_EVERY_S = 10.0
"""Seconds between two logged accept failures for lack of descriptors."""
ACCEPT_ERROR = "socket.accept() out of system resource"
"""The asyncio event loop's message for an accept that failed for lack of descriptors or memory."""


def connection_bound(requested: int = DEFAULT_MAX_CONNECTIONS) -> int:
    """`requested`, or half the process's soft descriptor limit when that is lower (the other half is
    left to the process's files, its clients and the accepts a full server closes at once)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return requested
    return max(1, min(requested, soft // 2))


@dataclass
class GuardCounts:
    """What the guard closed since the server started."""

    timed_out: int = 0
    """Connections that sent no complete request head within the head deadline."""
    evicted: int = 0
    """Idle connections closed to admit a new one past the bound."""
    refused: int = 0
    """New connections closed at once: the bound was reached and every open connection was busy."""


class ConnectionGuard:
    """One server's guard: `protocol(base)` returns uvicorn's protocol class `base` with the head deadline
    and the bound (see the module docstring); `counts` says what it closed."""

    def __init__(self, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S) -> None:
        if max_connections < 1 or head_timeout_s <= 0:
            raise ValueError(f"max_connections must be >= 1 and head_timeout_s > 0, got {max_connections}, "
                             f"{head_timeout_s}")
        self.max_connections = max_connections
        self.head_timeout_s = head_timeout_s
        self.counts = GuardCounts()
        self._open: set[Any] = set()
        """Connections admitted and not closed by the guard."""
        self._waiting: dict[Any, tuple[asyncio.TimerHandle, Any]] = {}
        """Connections waiting for a request head, oldest first: their deadline and the request cycle
        they had when it was armed (a new cycle means a head arrived)."""
        self._logged = GuardCounts()
        self._last_log = -SUMMARY_EVERY_S  # the first closing is logged at once

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def protocol(self, base: type) -> type:
        """uvicorn's HTTP protocol class `base` (httptools' or h11's) under this guard."""
        guard = self

        class Guarded(base):
            def connection_made(self, transport: asyncio.Transport) -> None:
                super().connection_made(transport)
                guard.admit(self)

            def data_received(self, data: bytes) -> None:
                super().data_received(data)
                guard.received(self)

            def on_response_complete(self) -> None:
                super().on_response_complete()
                guard.answered(self)

            def connection_lost(self, exc: Exception | None) -> None:
                guard.forget(self)
                super().connection_lost(exc)

        Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
        return Guarded

    # the protocol's events

    def admit(self, conn: Any) -> None:
        """A new connection: make room past the bound (or close it), then start its head deadline."""
        if len(self._open) >= self.max_connections:
            victim = next(iter(self._waiting), None)
            if victim is None:  # every open connection is answering a request
                self.counts.refused += 1
                conn.transport.close()
                self._maybe_log()
                return
            self.counts.evicted += 1
            self._close(victim)
        self._open.add(conn)
        self._arm(conn)

    def received(self, conn: Any) -> None:
        """Bytes arrived: a completed head (the protocol made a new request cycle) ends the deadline; a
        connection upgraded to another protocol (a WebSocket) is no longer the guard's."""
        if conn.transport.get_protocol() is not conn:
            self.forget(conn)
            return
        armed = self._waiting.get(conn)
        if armed is not None and conn.cycle is not armed[1]:
            self._disarm(conn)

    def answered(self, conn: Any) -> None:
        """A response went out: a connection kept open for its next request gets a new head deadline."""
        if conn in self._open and not conn.transport.is_closing() and (
                conn.cycle is None or conn.cycle.response_complete):
            self._arm(conn)

    def forget(self, conn: Any) -> None:
        self._disarm(conn)
        self._open.discard(conn)

    # internals

    def _arm(self, conn: Any) -> None:
        self._disarm(conn)
        timer = asyncio.get_running_loop().call_later(self.head_timeout_s, self._expire, conn, conn.cycle)
        self._waiting[conn] = (timer, conn.cycle)

    def _disarm(self, conn: Any) -> None:
        armed = self._waiting.pop(conn, None)
        if armed is not None:
            armed[0].cancel()

    def _expire(self, conn: Any, cycle: Any) -> None:
        armed = self._waiting.get(conn)
        if armed is not None and armed[1] is cycle:
            self.counts.timed_out += 1
            self._close(conn)

    def _close(self, conn: Any) -> None:
        self.forget(conn)
        conn.transport.close()
        self._maybe_log()

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < SUMMARY_EVERY_S:
            return
        c, seen = self.counts, self._logged
        log.warning("closed %d connection(s) that sent no request head within %g s, %d idle one(s) to admit new "
                    "connections past %d open, and refused %d while all were busy (counts since the previous "
                    "line of this kind; at most one a minute)", c.timed_out - seen.timed_out, self.head_timeout_s,
                    c.evicted - seen.evicted, self.max_connections, c.refused - seen.refused)
        self._logged = GuardCounts(c.timed_out, c.evicted, c.refused)
        self._last_log = now


class AcceptErrorThrottle(logging.Filter):
    """A filter for the `asyncio` logger letting through one "socket.accept() out of system resource"
    error every `every_s` seconds (CPython logs one per failed accept, with a traceback, hundreds a
    second while descriptors are exhausted); the next one let through says how many were left out."""

    def __init__(self, every_s: float = ACCEPT_ERROR_EVERY_S) -> None:
        super().__init__()
        self.every_s = every_s
        self.suppressed = 0
        self._last = -float("inf")

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(ACCEPT_ERROR):
            return True
        now = time.monotonic()
        if now - self._last < self.every_s:
            self.suppressed += 1
            return False
        if self.suppressed:
            record.msg = f"{record.msg} ({self.suppressed} more left out of the log in the last {now - self._last:.0f} s)"
            self.suppressed = 0
        self._last = now
        return True
