"""Prometheus helpers shared by the services. Each service defines its own metrics in its own
`metrics.py` on its own `CollectorRegistry` (names `searchr1_<service>_…`, base units, `_total`
counters, low-cardinality labels); this module serves a registry — with the probes of a service whose
only port is its metrics port: `/healthz` (alive: always 200) and `/readyz` (200 when ready, 503 when
not, e.g. while Redis is away) — and defines the Redis-link metrics every Redis user carries.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, make_wsgi_app, start_http_server
from prometheus_client.exposition import ThreadingWSGIServer

from searchr1.core.auth import token_matches


def new_registry() -> CollectorRegistry:
    """A fresh registry (never the process-global default, so tests and services don't collide)."""
    return CollectorRegistry(auto_describe=True)


@dataclass
class RedisMetrics:
    """`searchr1_<service>_redis_retries_total` (Redis calls retried while it was away),
    `…_redis_reconnects_total` (times it came back) and `…_redis_up` (1 when the last call or PING
    was answered)."""

    retries: Counter
    reconnects: Counter
    up: Gauge

    @classmethod
    def on(cls, registry: CollectorRegistry, service: str) -> RedisMetrics:
        p = f"searchr1_{service}_redis"
        return cls(Counter(f"{p}_retries_total", "Redis calls retried while Redis was unavailable.", registry=registry),
                   Counter(f"{p}_reconnects_total", "Times Redis answered again after being unavailable.",
                           registry=registry),
                   Gauge(f"{p}_up", "1 when Redis answered the last call or PING, else 0.", registry=registry))

    def link_callbacks(self) -> dict[str, Any]:
        """The `on_retry`, `on_reconnect` and `on_state` callbacks of a `searchr1.core.streams.RedisLink`."""
        return {"on_retry": lambda exc: self.retries.inc(), "on_reconnect": self.reconnects.inc,
                "on_state": lambda up: self.up.set(1 if up else 0)}


@dataclass
class MetricsServer:
    """A running `/metrics` HTTP endpoint in a daemon thread."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


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


def _with_probes(app, ready: Callable[[], bool]):
    """`app` behind `/healthz` (200) and `/readyz` (200 or 503 from `ready()`), both open to probes."""

    def probed(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path not in ("/healthz", "/readyz"):
            return app(environ, start_response)
        ok = path == "/healthz" or bool(ready())
        body = json.dumps({"ok": ok} if path == "/healthz" else {"ready": ok}).encode()
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return probed


def start_metrics_server(registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0, *,
                         token: str | None = None, ready: Callable[[], bool] | None = None) -> MetricsServer:
    """Serve `registry` at http://host:port/metrics (port 0 picks a free one; see `.port`); with `token`,
    only to requests that carry `Authorization: Bearer <token>` (others get 401). With `ready`, also
    `/healthz` and `/readyz` (see the module docstring; open without the token, like every health path)."""
    if not token and ready is None:
        server, thread = start_http_server(port, addr=host, registry=registry)
        return MetricsServer(server, thread)
    app = make_wsgi_app(registry)
    if token:
        app = _bearer_guarded(app, token)
    if ready is not None:
        app = _with_probes(app, ready)
    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)


