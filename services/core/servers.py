"""Server plumbing shared by the services, so no service copies it: an asyncio gRPC server with the
standard health service, reflection, optional bearer auth and a clear INVALID_ARGUMENT for request bytes
that do not parse (bad wire format, non-UTF-8 string fields); a uvicorn HTTP server that can run on
port 0 inside an existing event loop, behind the connection guard (`searchr1.core._http_guard`: request
heads time out, open connections are bounded and idle ones give way); and graceful shutdown on
SIGINT/SIGTERM.

Services pass their servicers / FastAPI app in; this module knows nothing about retrieval or rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import signal
import socket
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc
import uvicorn
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from searchr1.core._body_limit import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, BodyLimit
from searchr1.core._http_guard import (
    DEFAULT_HEAD_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    AcceptErrorThrottle,
    ConnectionGuard,
    connection_bound,
)
from searchr1.core.aio import stop_task
from searchr1.core.auth import BearerAuthInterceptor

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_CONCURRENT_RPCS = 1024
"""Calls one gRPC server runs at once; more are refused with RESOURCE_EXHAUSTED (a transient code the
clients retry), so a flood of calls cannot queue without bound in one process."""


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """Parse unary requests inside the call, so bytes that are not a valid message (broken wire format,
    a string field holding non-UTF-8 bytes) end the call with INVALID_ARGUMENT and the parser's message.

    Without it grpc-python parses before the handler runs and answers UNKNOWN ("Unexpected DecodeError"),
    which clients treat as a server fault. Streaming-request methods and sync handlers are left as they are.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if (handler is None or handler.request_streaming or handler.request_deserializer is None
                or not handler.unary_unary or not inspect.iscoroutinefunction(handler.unary_unary)):
            return handler
        parse, inner, method = handler.request_deserializer, handler.unary_unary, handler_call_details.method

        async def parsed(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:
                request = parse(raw)
            except Exception as exc:  # noqa: BLE001 - any parser failure is the request's fault
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {method} request: {exc}")
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(parsed, response_serializer=handler.response_serializer)


class GrpcServer:
    """An asyncio gRPC server: `add(register_fn, servicer, service_name)` then `await start()`.

    The health service reports SERVING for "" and every added service once started, and NOT_SERVING
    from the moment `stop()` begins, so load balancers drain before the port closes.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_receive_bytes: int | None = None,
        max_concurrent_rpcs: int | None = DEFAULT_MAX_CONCURRENT_RPCS,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        reflection_enabled: bool = True,
    ) -> None:
        chain = [MalformedRequestInterceptor(), *interceptors]
        if token:
            chain.insert(0, BearerAuthInterceptor(token))
        self._server = grpc.aio.server(
            interceptors=chain,
            maximum_concurrent_rpcs=max_concurrent_rpcs,  # beyond it, RESOURCE_EXHAUSTED (retried by clients)
            options=[
                # a request over it is refused by gRPC before any handler (or the auth check) sees it
                ("grpc.max_receive_message_length", max_receive_bytes or max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.so_reuseport", 0),
                # flow-control windows stay at HTTP/2's 64 KiB per stream unless a read asks for a whole
                # message: a call refused unread (no token) then leaves at most a window buffered, where
                # bandwidth-delay probing grew them to megabytes (96 refused 12 MB calls: +340 MiB RSS)
                ("grpc.http2.bdp_probe", 0),
            ],
        )
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self._services: list[str] = []
        self._reflection = reflection_enabled
        self._host = host
        self._requested_port = port
        self.port: int | None = None

    def add(self, register: Callable[[Any, grpc.aio.Server], None], servicer: Any, service_name: str) -> None:
        """Register a servicer with its generated `add_XServicer_to_server` function."""
        register(servicer, self._server)
        self._services.append(service_name)

    async def start(self) -> int:
        """Bind, start and mark every service SERVING; returns the bound port."""
        if self._reflection:
            reflection.enable_server_reflection(
                [*self._services, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME],
                self._server,
            )
        if self._requested_port and not port_is_free(self._host, self._requested_port):
            # checked first: gRPC's own bind failure is a RuntimeError after a C-level log line
            raise OSError(f"cannot bind gRPC server to {self._host}:{self._requested_port}: address already in use")
        try:
            bound = self._server.add_insecure_port(f"{self._host}:{self._requested_port}")
        except RuntimeError as exc:
            raise OSError(f"cannot bind gRPC server to {self._host}:{self._requested_port}: {exc}") from None
        if bound == 0:
            raise OSError(f"cannot bind gRPC server to {self._host}:{self._requested_port} (port in use?)")
        self.port = bound
        await self._server.start()
        for name in ["", *self._services]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return bound

    async def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, then let in-flight calls finish for up to `grace` seconds."""
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)

    async def wait(self) -> None:
        """Until the server terminates. Waited with a timeout, so gRPC waits through a shield: without one it
        awaits the server's own shutdown future, a cancelled wait cancels that future, and `stop` then
        raises CancelledError."""
        while await self._server.wait_for_termination(timeout=3600.0):
            pass


ACCEPT_BACKLOG = 128
"""The HTTP listening socket's backlog, which is also how many connections the event loop accepts in one
pass before any of them reaches the connection guard (uvicorn's 2,048 let a burst of idle connections
take every descriptor of a 1,024 limit before the guard closed one)."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (port 0: a free one), for an `HttpServer` whose port must be known
    before its app is built (a server whose app announces its own URL)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto is TCP, and accepted
    # sockets inherit proto 0 otherwise (Nagle + delayed ACK then add ~40 ms to every small response)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind HTTP server to {host}:{port}: {exc.strerror}") from exc
    return sock


class HttpServer:
    """uvicorn serving an ASGI app inside the current event loop, on a socket bound up front so port 0
    works and the real port is known before the first request; request bodies over `max_body_bytes` are
    answered 413 and bodies slower than `body_timeout_s` 408 (`searchr1.core._body_limit`); a connection
    that sends no complete request head within `head_timeout_s` is closed, and at most `max_connections`
    are open (lowered to half the descriptor limit), idle ones closed first (`searchr1.core._http_guard`;
    `guard.counts` says what it closed)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, sock: socket.socket | None = None,
                 log_level: str = "warning", max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S) -> None:
        """`sock`: a socket already bound (`bind_socket`) to `host:port`, used instead of binding one."""
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        self._sock = sock if sock is not None else bind_socket(host, port)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self.guard = ConnectionGuard(connection_bound(max_connections), head_timeout_s)
        # bodies over max_body_bytes get 413 before the app parses them, slow ones 408
        config = uvicorn.Config(BodyLimit(app, max_body_bytes, body_timeout_s), log_level=log_level, lifespan="on",
                                access_log=False, http=self.guard.protocol(AutoHTTPProtocol), backlog=ACCEPT_BACKLOG)
        self._server = uvicorn.Server(config)
        setattr(self._server, "install_signal_handlers", lambda: None)  # noqa: B010 - we own the signals
        self._task: asyncio.Task | None = None
        self._throttle = AcceptErrorThrottle()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def task(self) -> asyncio.Task | None:
        """The serve task once `start`ed: a service supervises it (`searchr1.core.supervise`), so a server
        that stopped serving stops the process instead of leaving it up and deaf."""
        return self._task

    async def start(self) -> int:
        logging.getLogger("asyncio").addFilter(self._throttle)  # accept failures: one line every 10 s
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # re-raise the start-up failure
                raise RuntimeError("HTTP server exited during start-up")
            await asyncio.sleep(0.01)
        return self.port

    async def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (open connections get `timeout` s to finish), then a forced one."""
        self._server.should_exit = True
        if self._task is not None:
            done, _ = await asyncio.wait({self._task}, timeout=timeout)
            if not done:
                self._server.force_exit = True
            await stop_task(self._task, timeout=timeout)
        self._sock.close()
        logging.getLogger("asyncio").removeFilter(self._throttle)


def install_shutdown_signals(stop: asyncio.Event, signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """Set `stop` on SIGINT/SIGTERM (a second signal falls back to the default handler)."""
    loop = asyncio.get_running_loop()

    def _on_signal(sig: int) -> None:
        stop.set()
        loop.remove_signal_handler(sig)

    add_signal_handlers(_on_signal, signals)


def add_signal_handlers(handler: Callable[[int], None],
                        signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """Call `handler(sig)` on the running loop for each of `signals` (where the loop can handle them)."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler, sig)


def remove_signal_handlers(signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """Undo `add_signal_handlers`."""
    loop = asyncio.get_running_loop()
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(sig)


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_FREE_PORT = 10_000
"""`free_port` draws from [LOWEST_FREE_PORT, 65535] minus the kernel's ephemeral range."""


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for bind(0) and outgoing connections (Linux's default where it cannot be read)."""
    try:
        lo, hi = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, for a subprocess to bind later (servers themselves bind 0).

    It is drawn at random from outside the kernel's ephemeral range: a port from bind(0) is in that range,
    where any other process's bind(0) or outgoing connection (a vLLM engine opens dozens) may take it in
    the seconds or minutes before the subprocess binds it; then that process fails with "Address already
    in use", and so does every restart on the same port."""
    lo, hi = ephemeral_port_range()
    spans = [(a, b) for a, b in ((LOWEST_FREE_PORT, lo - 1), (hi + 1, 65535)) if a <= b]
    rng = random.SystemRandom()
    for _ in range(200):
        if not spans:
            break
        a, b = rng.choices(spans, weights=[b - a + 1 for a, b in spans])[0]
        port = rng.randint(a, b)
        if port_is_free(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # every port outside the range is taken
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port (the launcher refuses clearly otherwise)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
