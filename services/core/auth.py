"""Bearer-token auth for HTTP (ASGI middleware) and gRPC (server interceptor), the client-side helpers,
and the start-up rule every server that takes a token follows (`require_token`): an empty token refuses
to start unless `auth.insecure_no_auth` (`--insecure-no-auth`) says to serve without one, and then a
WARNING is printed.

Health stays open so probes work without the secret; metrics stay open by default so Prometheus does
too, and are closed with `open_paths(metrics_open=False)`. gRPC reflection (the service's schema) needs
the token like any other call. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from searchr1.core.settings import AuthSettings

HEALTH_GRPC_PREFIX = "/grpc.health.v1.Health/"
REFLECTION_GRPC_PREFIX = "/grpc.reflection."
LIVE_PATH = "/healthz"
"""Liveness: 200 while the process serves (every HTTP server of the system answers it)."""
READY_PATH = "/readyz"
"""Readiness: 200 when the process can do its work, 503 while a dependency (Redis) is away."""
HEALTH_PATHS = (LIVE_PATH, READY_PATH)
DEFAULT_OPEN_PATHS = (*HEALTH_PATHS, "/metrics")


class MissingToken(ValueError):
    """A server was asked to start without a token and without `auth.insecure_no_auth`."""


def require_token(token: str | None, auth: AuthSettings, *, server: str, setting: str) -> str | None:
    """Start-up check of a server's `token` (`setting` names where it is set, e.g. `RETRIEVER_TOKEN`):
    None when a token is set; the warning to print when it is empty and `auth.insecure_no_auth` is on;
    otherwise `MissingToken` with what to do."""
    if token:
        return None
    if auth.insecure_no_auth:
        return (f"{server} serves WITHOUT authentication (auth.insecure_no_auth is on): anyone who can reach "
                f"its port can call it; set {setting} for anything but a private loopback run")
    raise MissingToken(f"{server} has no token: set {setting} to a secret (e.g. `openssl rand -hex 16`), or "
                       f"serve without auth on purpose with --insecure-no-auth (auth.insecure_no_auth = true)")


def open_paths(*, metrics_open: bool) -> tuple[str, ...]:
    """The HTTP paths served without the token: health always, `/metrics` unless `metrics_open` is False."""
    return DEFAULT_OPEN_PATHS if metrics_open else HEALTH_PATHS


def token_matches(header_value: str | None, token: str) -> bool:
    """True when `header_value` is `Bearer <token>` (scheme case-insensitive)."""
    if not header_value:
        return False
    scheme, _, given = header_value.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def http_headers(token: str | None) -> dict[str, str]:
    """Headers a client sends (empty without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def grpc_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata a client sends (empty without a token)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


class BearerAuthMiddleware:
    """ASGI middleware: HTTP requests outside `open_paths` need `Authorization: Bearer <token>`,
    else 401 with a JSON error."""

    def __init__(self, app: Any, token: str, open_paths: Iterable[str] = DEFAULT_OPEN_PATHS) -> None:
        if not token:
            raise ValueError("BearerAuthMiddleware needs a non-empty token")
        self.app = app
        self.token = token
        self.open_paths = tuple(open_paths)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or self._is_open(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        if token_matches(header, self.token):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": "missing or invalid bearer token"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"connection", b"close")]})  # an unread body is not waited for
        await send({"type": "http.response.body", "body": body})

    def _is_open(self, path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in self.open_paths)


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    """gRPC server interceptor: calls other than health (reflection included) need `authorization:
    Bearer <token>` metadata, else UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("BearerAuthInterceptor needs a non-empty token")
        self.token = token

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        async def deny_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")
            yield  # pragma: no cover - abort raises

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny_stream)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        if method.startswith(HEALTH_GRPC_PREFIX):
            return await continuation(handler_call_details)
        header = dict(handler_call_details.invocation_metadata or ()).get("authorization")
        if token_matches(header, self.token):
            return await continuation(handler_call_details)
        return self._deny_stream if method.startswith(REFLECTION_GRPC_PREFIX) else self._deny
