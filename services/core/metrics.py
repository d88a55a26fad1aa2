"""Prometheus helpers shared by the services. Each service defines its own metrics in its own
`metrics.py` on its own `CollectorRegistry` (names `searchr1_<service>_…`, base units, `_total`
counters, low-cardinality labels); this module serves a registry — with the probes of a service whose
only port is its metrics port: `/healthz` (alive: always 200) and `/readyz` (200 when ready, 503 when
not, e.g. while Redis is away) — defines the Redis-link metrics every Redis user carries, and keeps the
stage clock (`StageClock`: a process's wall time split into stages, exposed as a counter of seconds per
stage).

The server is bounded: at most `max_connections` connections are served at once (one thread each), a
read that waits longer than `read_timeout_s` ends its connection, and a connection still open `deadline_s`
after it was accepted is shut down when the next one arrives, so half-sent or slow-drip requests cannot
pile up threads. Idle clients cannot starve the probes: a connection past the bound shuts down the oldest
one that has not sent a complete request head yet (an idle or half-sent one) and is served in its place;
only when every connection is being answered is the newcomer closed at once.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from searchr1.core.auth import HEALTH_PATHS, LIVE_PATH, token_matches


def new_registry() -> CollectorRegistry:
    """A fresh registry (never the process-global default, so tests and services don't collide)."""
    return CollectorRegistry(auto_describe=True)


@dataclass
class RedisMetrics:
    """`searchr1_<service>_redis_retries_total` (Redis calls retried while it was away),
    `…_redis_reconnects_total` (times it came back), `…_redis_up` (1 when the last call or PING
    was answered), `…_redis_memory_used_bytes` and `…_redis_memory_max_bytes` (Redis's `used_memory` and
    `maxmemory`, 0: no limit; sampled by the link's watch) and `…_redis_errors_total{kind}` (Redis
    refusals that are not outages: `oom`, `misconf`, `readonly`, waited through like an outage)."""

    retries: Counter
    reconnects: Counter
    up: Gauge
    memory_used: Gauge
    memory_max: Gauge
    errors: Counter

    @classmethod
    def on(cls, registry: CollectorRegistry, service: str) -> RedisMetrics:
        p = f"searchr1_{service}_redis"
        return cls(Counter(f"{p}_retries_total", "Redis calls retried while Redis was unavailable.", registry=registry),
                   Counter(f"{p}_reconnects_total", "Times Redis answered again after being unavailable.",
                           registry=registry),
                   Gauge(f"{p}_up", "1 when Redis answered the last call or PING, else 0.", registry=registry),
                   Gauge(f"{p}_memory_used_bytes", "Redis used_memory, sampled.", registry=registry),
                   Gauge(f"{p}_memory_max_bytes", "Redis maxmemory (0: no limit), sampled.", registry=registry),
                   Counter(f"{p}_errors_total", "Redis refusals that are not outages (OOM, MISCONF, READONLY), "
                           "waited through.", ["kind"], registry=registry))

    def link_callbacks(self) -> dict[str, Any]:
        """The `on_retry`, `on_reconnect` and `on_state` callbacks of a `searchr1.streams.RedisLink`."""
        return {"on_retry": lambda exc: self.retries.inc(), "on_reconnect": self.reconnects.inc,
                "on_state": lambda up: self.up.set(1 if up else 0), "on_memory": self._memory,
                "on_refusal": lambda kind: self.errors.labels(kind).inc()}

    def _memory(self, used: int, limit: int) -> None:
        self.memory_used.set(used)
        self.memory_max.set(limit)


@dataclass
class MetricsServer:
    """A running `/metrics` HTTP endpoint in a daemon thread."""

    server: WSGIServer
    thread: threading.Thread
    closing: threading.Event = field(default_factory=threading.Event)
    """Set by `close`: the serve thread's end is expected from then on."""
    on_death: Callable[[str, BaseException | None], None] | None = None
    """Called with ("metrics server", the exception or None) if the serve thread ends before `close`
    (a service's `searchr1.core.supervise.Supervisor.fail`): the probes would go unanswered otherwise."""

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


DEFAULT_MAX_CONNECTIONS = 16
"""Connections the metrics/probe server serves at once (a scrape and a few probes need far fewer)."""
DEFAULT_READ_TIMEOUT_S = 5.0
"""Seconds one read of a request may wait before its connection is closed."""
DEFAULT_DEADLINE_S = 30.0
"""Seconds a connection may stay open in all."""


class _QuietHandler(WSGIRequestHandler):
    timeout = DEFAULT_READ_TIMEOUT_S  # socket timeout of every read (StreamRequestHandler.setup applies it)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def parse_request(self) -> bool:
        """The request head was read: from here on the connection is being answered, not idle."""
        ok = super().parse_request()
        if ok and isinstance(self.server, BoundedWSGIServer):
            self.server.answering(self.request)
        return ok


class BoundedWSGIServer(ThreadingWSGIServer):
    """A thread per connection, at most `max_connections` of them served, none older than `deadline_s`,
    idle ones giving way to new ones (see the module docstring); with the ones shut down and still ending,
    at most twice that many threads."""

    def __init__(self, address: tuple[str, int], handler: type, *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)
        self.max_connections, self.deadline_s = max_connections, deadline_s
        self._lock = threading.Lock()
        self._open: dict[socket.socket, list] = {}  # connection → [when accepted, being answered], oldest first
        self._ending: set[socket.socket] = set()  # shut down, their threads not yet ended
        self.refused = 0
        """New connections closed at once: every served one was being answered."""
        self.evicted = 0
        """Connections shut down before their request head was complete, to serve a newer one."""

    def process_request(self, request, client_address) -> None:
        now = time.monotonic()
        with self._lock:
            for conn, (since, _) in list(self._open.items()):
                if now - since > self.deadline_s:  # unblocks the reading thread, which then ends
                    self._shut(conn)
            full = len(self._open) >= self.max_connections
            if full and len(self._ending) < self.max_connections:  # threads: at most twice the bound
                idle = next((c for c, (_, answering) in self._open.items() if not answering), None)
                if idle is not None:
                    self.evicted += 1
                    self._shut(idle)
                    full = False
            if not full:
                self._open[request] = [now, False]
        if full:
            self.refused += 1
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def answering(self, request) -> None:
        """The connection's request head arrived (called from its thread)."""
        with self._lock:
            if request in self._open:
                self._open[request][1] = True

    def _shut(self, conn: socket.socket) -> None:
        """Stop serving `conn` (lock held): its thread's read or write fails and the thread ends."""
        if self._open.pop(conn, None) is not None:
            self._ending.add(conn)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open.pop(request, None)
                self._ending.discard(request)

    def handle_error(self, request, client_address) -> None:
        """A client that timed out or went away is not an error of the server: no traceback."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handle_error(request, client_address)


def _bearer_guarded(app, token: str):
    """A WSGI app answering 401 (JSON `detail`, `WWW-Authenticate: Bearer`) unless the request carries
    `Authorization: Bearer <token>`."""
    denied = json.dumps({"detail": "missing or invalid bearer token"}).encode()

    def guarded(environ, start_response):
        if token_matches(environ.get("HTTP_AUTHORIZATION"), token):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "application/json"), ("WWW-Authenticate", "Bearer"),
                                            ("Content-Length", str(len(denied)))])
        return [denied]

    return guarded


def _with_probes(app, ready: Callable[[], bool], live: Callable[[], bool] | None = None):
    """`app` behind `/healthz` (200, or 503 when `live()` is False) and `/readyz` (200 or 503 from
    `ready()`), both open to probes."""

    def probed(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path not in HEALTH_PATHS:
            return app(environ, start_response)
        ok = bool(live()) if path == LIVE_PATH and live is not None else path == LIVE_PATH or bool(ready())
        body = json.dumps({"ok": ok} if path == LIVE_PATH else {"ready": ok}).encode()
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return probed


def start_metrics_server(registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0, *,
                         token: str | None = None, ready: Callable[[], bool] | None = None,
                         live: Callable[[], bool] | None = None, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                         read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
                         deadline_s: float = DEFAULT_DEADLINE_S,
                         on_death: Callable[[str, BaseException | None], None] | None = None) -> MetricsServer:
    """Serve `registry` at http://host:port/metrics (port 0 picks a free one; see `.port`); with `token`,
    only to requests that carry `Authorization: Bearer <token>` (others get 401). With `ready`, also
    `/healthz` and `/readyz` (see the module docstring; open without the token, like every health path);
    with `live` too (`searchr1.core.watchdog`), `/healthz` is 503 while it is False. The server is bounded
    by `max_connections`, `read_timeout_s` and `deadline_s` (the module docstring); `on_death`: see
    `MetricsServer.on_death` (settable later)."""
    app = make_wsgi_app(registry)
    if token:
        app = _bearer_guarded(app, token)
    if ready is not None:
        app = _with_probes(app, ready, live)
    handler = type("_Handler", (_QuietHandler,), {"timeout": read_timeout_s})
    server = BoundedWSGIServer((host, port), handler, max_connections=max_connections, deadline_s=deadline_s)
    server.set_app(app)
    running = MetricsServer(server, threading.Thread(), on_death=on_death)

    def serve() -> None:
        cause: BaseException | None = None
        try:
            server.serve_forever()
        except BaseException as exc:  # noqa: BLE001 - reported to the service, which stops on it
            cause = exc
        if running.on_death is not None and not running.closing.is_set():
            running.on_death("metrics server", cause)

    running.thread = threading.Thread(target=serve, name="metrics", daemon=True)
    running.thread.start()
    return running


class StageClock:
    """Splits a process's wall time into named stages that never overlap, for a stacked breakdown
    (`searchr1_<service>_stage_seconds_total{stage=…}`) whose stages add up to the time elapsed.

    `stages` are in priority order: when several are active at once (concurrent trajectories, or a stage
    nested in another) the time goes to the first of them; when none is, to `idle`. So a rollout worker
    with one trajectory generating and another waiting on search counts generation, and one with all
    its trajectories waiting on search counts search wait. Thread-safe (the learner enters stages on its
    event loop and in its training thread); `clock` is injectable for tests.
    """

    def __init__(self, stages: Sequence[str], idle: str = "idle", clock: Callable[[], float] = time.monotonic) -> None:
        if not stages or len(set(stages)) != len(stages) or idle in stages:
            raise ValueError(f"stages must be distinct, non-empty and not the idle stage {idle!r}: {list(stages)}")
        self.stages = tuple(stages)
        self.idle = idle
        self._clock = clock
        self._lock = threading.Lock()
        self._active = dict.fromkeys(self.stages, 0)
        self._totals = dict.fromkeys((*self.stages, idle), 0.0)
        self._since = clock()

    def _current(self) -> str:
        return next((s for s in self.stages if self._active[s]), self.idle)

    def _settle(self) -> None:
        now = self._clock()
        self._totals[self._current()] += now - self._since
        self._since = now

    def enter(self, stage: str) -> None:
        with self._lock:
            if stage not in self._active:
                raise KeyError(f"unknown stage {stage!r} (known: {', '.join(self.stages)})")
            self._settle()
            self._active[stage] += 1

    def exit(self, stage: str) -> None:
        with self._lock:
            if not self._active.get(stage):
                raise RuntimeError(f"stage {stage!r} exited more often than entered")
            self._settle()
            self._active[stage] -= 1

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """`with clock.stage("generation"): …` (also across awaits: each task enters and exits its own)."""
        self.enter(stage)
        try:
            yield
        finally:
            self.exit(stage)

    def totals(self) -> dict[str, float]:
        """Seconds per stage (`idle` included) since the clock started, up to now."""
        with self._lock:
            self._settle()
            return dict(self._totals)


def in_stage(stage: str, clock_of: Callable[[Any], StageClock | None]):
    """Decorates a method (sync or async) so that each call runs in `stage` of `clock_of(self)` (nothing
    is timed when that is None)."""

    def decorate(fn):
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(self, *args, **kwargs):
                clock = clock_of(self)
                with clock.stage(stage) if clock is not None else nullcontext():
                    return await fn(self, *args, **kwargs)
            return run_async

        @functools.wraps(fn)
        def run(self, *args, **kwargs):
            clock = clock_of(self)
            with clock.stage(stage) if clock is not None else nullcontext():
                return fn(self, *args, **kwargs)
        return run

    return decorate


class StageCollector(Collector):
    """Exposes a `StageClock`'s totals as one counter family `name` (`…_total{stage=…}`; `name` may end
    in `_total`), read at scrape time, so the stage in progress is counted up to the scrape."""

    def __init__(self, name: str, documentation: str, clock: StageClock) -> None:
        self.name, self.documentation, self.clock = name, documentation, clock

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=["stage"])
        for stage, seconds in self.clock.totals().items():
            family.add_metric([stage], seconds)
        yield family
