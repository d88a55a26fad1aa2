"""Bearer-token auth for HTTP (ASGI middleware) and gRPC (server interceptor), the client-side helpers,
and the start-up rule every server that takes a token follows (`require_token`): an empty token refuses
to start unless `auth.insecure_no_auth` (`--insecure-no-auth`) says to serve without one, and then a
WARNING is printed.

Health stays open so probes work without the secret; metrics stay open by default so Prometheus does
too, and are closed with `open_paths(metrics_open=False)`. gRPC reflection (the service's schema) needs
the token like any other call. Tokens are compared in constant time.

gRPC checks the token before the request message is read: the interceptor sees the call's metadata
first, and a call without the token is refused by a handler that never reads its message, so an
unauthenticated caller cannot make the server hold a request of up to its receive limit (12 MB for the
retriever at its default bounds). The one kind of call served without the token, the health service, is
read only a few at a time (`max_open_calls`) and within `open_read_timeout_s`; more at once are
RESOURCE_EXHAUSTED, unread. So what callers without the token can make a server hold is bounded by
`max_open_calls` × its receive limit, whatever their number.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
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


DEFAULT_OPEN_CALLS = 4
"""gRPC calls without the token (health checks) read at once; probes need one or two."""
DEFAULT_OPEN_READ_TIMEOUT_S = 5.0
"""Seconds a health check without the token may take to send its request."""
_DENIED = "missing or invalid bearer token"


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    """gRPC server interceptor: calls other than health (reflection included) need `authorization:
    Bearer <token>` metadata, else UNAUTHENTICATED before their message is read; health checks without
    it are served `max_open_calls` at a time (the module docstring)."""

    def __init__(self, token: str, *, max_open_calls: int = DEFAULT_OPEN_CALLS,
                 open_read_timeout_s: float = DEFAULT_OPEN_READ_TIMEOUT_S) -> None:
        if not token:
            raise ValueError("BearerAuthInterceptor needs a non-empty token")
        if max_open_calls < 1:
            raise ValueError(f"max_open_calls must be at least 1, got {max_open_calls}")
        self.token = token
        self.max_open_calls = max_open_calls
        self.open_read_timeout_s = open_read_timeout_s
        self.open_calls = 0
        """Health checks without the token being served now."""
        self.refused = 0
        """Calls refused unread: no token (other than health), or health past `max_open_calls`."""

        # request-streaming handlers: gRPC reads a request message only when the handler asks for it
        async def deny(requests: Any, context: grpc.aio.ServicerContext) -> None:
            self.refused += 1
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)

        async def deny_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            self.refused += 1
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)
            yield  # pragma: no cover - abort raises

        self._deny = grpc.stream_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny_stream)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        header = dict(handler_call_details.invocation_metadata or ()).get("authorization")
        if token_matches(header, self.token):
            return await continuation(handler_call_details)
        if method.startswith(HEALTH_GRPC_PREFIX):
            return self._bounded(await continuation(handler_call_details))
        return self._deny_stream if method.startswith(REFLECTION_GRPC_PREFIX) else self._deny

    def _bounded(self, handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        """`handler` (a unary-request method) as a request-streaming one that reads its one message only
        when fewer than `max_open_calls` are being read and answered, within `open_read_timeout_s`."""
        if handler is None or handler.request_streaming:
            return handler
        inner = handler.unary_unary or handler.unary_stream

        async def read_one(context: grpc.aio.ServicerContext) -> Any:
            try:
                request = await asyncio.wait_for(context.read(), self.open_read_timeout_s)
            except TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                    f"request not received within {self.open_read_timeout_s:g} s")
            if request is grpc.aio.EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message")
            return request

        async def admit(context: grpc.aio.ServicerContext) -> None:
            if self.open_calls >= self.max_open_calls:
                self.refused += 1
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"more than {self.max_open_calls} calls without a token at once")
            self.open_calls += 1

        if handler.unary_unary is not None:
            async def unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                await admit(context)
                try:
                    return await inner(await read_one(context), context)
                finally:
                    self.open_calls -= 1

            return grpc.stream_unary_rpc_method_handler(unary, request_deserializer=handler.request_deserializer,
                                                        response_serializer=handler.response_serializer)

        async def streamed(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await admit(context)
            try:
                request = await read_one(context)
                if inspect.isasyncgenfunction(inner):
                    async for response in inner(request, context):
                        yield response
                else:
                    await inner(request, context)  # writes with context.write
            finally:
                self.open_calls -= 1

        return grpc.stream_stream_rpc_method_handler(streamed, request_deserializer=handler.request_deserializer,
                                                     response_serializer=handler.response_serializer)
