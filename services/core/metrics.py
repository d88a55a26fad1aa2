"""Prometheus helpers shared by the services. Each service defines its own metrics in its own
`metrics.py` on its own `CollectorRegistry` (names `searchr1_<service>_…`, base units, `_total`
counters, low-cardinality labels); this module only serves a registry.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app, start_http_server
from prometheus_client.exposition import ThreadingWSGIServer

from searchr1.core.auth import token_matches


def new_registry() -> CollectorRegistry:
    """A fresh registry (never the process-global default, so tests and services don't collide)."""
    return CollectorRegistry(auto_describe=True)


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


def start_metrics_server(registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0, *,
                         token: str | None = None) -> MetricsServer:
    """Serve `registry` at http://host:port/metrics (port 0 picks a free one; see `.port`); with `token`,
    only to requests that carry `Authorization: Bearer <token>` (others get 401)."""
    if not token:
        server, thread = start_http_server(port, addr=host, registry=registry)
        return MetricsServer(server, thread)
    server = make_server(host, port, _bearer_guarded(make_wsgi_app(registry), token), ThreadingWSGIServer,
                         handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread)


