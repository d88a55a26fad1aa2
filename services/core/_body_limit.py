"""Bounds on HTTP request bodies, enforced as the application reads them: an ASGI middleware that
answers 413 when `Content-Length` says the body is too large, counts a body's bytes as the application
receives them (a chunked body without `Content-Length` included) and answers 413 as soon as they pass the
bound, and answers 408 when the body has not arrived in full `timeout_s` after the application began to
read it. Both refusals close the connection.

Nothing is read or buffered here ahead of the application: the auth check inside it answers 401 before
any byte of the body is taken off the socket (uvicorn's flow control keeps at most a read buffer per
connection), so an unauthenticated client cannot make the server hold its body, and a slow-drip body
holds a connection for at most `timeout_s`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 60.0
"""Seconds a request body may take to arrive, counted from the application's first read of it."""


class _Refused(Exception):
    """Raised out of `receive` after the middleware answered the request itself (413 or 408)."""


class _Guarded:
    """One request's `receive` and `send`, counting and timing the body the application reads."""

    def __init__(self, receive: Receive, send: Send, max_bytes: int, timeout_s: float) -> None:
        self._receive, self._send = receive, send
        self.max_bytes, self.timeout_s = max_bytes, timeout_s
        self.seen = 0
        self.body_done = False
        self.started = False  # the application began its response
        self.answered = False  # the middleware answered instead
        self._deadline: float | None = None

    async def receive(self) -> Message:
        if self.body_done:  # the body is in: what follows is the wait for a disconnect, not bounded here
            return await self._receive()
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self.timeout_s
        try:
            message = await asyncio.wait_for(self._receive(), max(0.0, self._deadline - loop.time()))
        except TimeoutError:
            await self.answer(408, f"request body not received within {self.timeout_s:g} s")
            raise _Refused from None
        if message["type"] != "http.request":
            self.body_done = True
            return message
        self.seen += len(message.get("body", b""))
        if self.seen > self.max_bytes:
            await self.answer(413, f"request body larger than {self.max_bytes} bytes")
            raise _Refused
        self.body_done = not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if self.answered:
            return  # the middleware's answer stands; the application's is dropped
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def answer(self, status: int, detail: str) -> None:
        if self.started or self.answered:
            return
        self.answered = True
        await _respond(self._send, status, detail)


async def _respond(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: HTTP request bodies over `max_bytes` get 413, bodies slower than `timeout_s`
    get 408 (see the module docstring); the application never sees more than `max_bytes`."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int,
                 timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_bytes
            except ValueError:
                too_large = False  # the server refuses a malformed Content-Length itself
            if too_large:
                await _respond(send, 413, f"request body larger than {self.max_bytes} bytes")
                return
        guarded = _Guarded(receive, send, self.max_bytes, self.timeout_s)
        try:
            await self.app(scope, guarded.receive, guarded.send)
        except Exception:
            if not guarded.answered:  # the application's own failure
                raise
            # the body was refused: the application's reaction to the failed read is moot
