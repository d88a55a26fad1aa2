"""Size and time limits before work, over real HTTP on loopback: a body over the server's bound is answered
413 without the handler getting it (declared by Content-Length, or streamed chunked without one); a body
within it is served; every service's HTTP server has the bound by default; the auth check answers 401
before any of the body is read; a body that does not arrive in time is answered 408 and the connection
closed."""

from __future__ import annotations

import socket

import httpx
from fastapi import FastAPI, Request

from searchr1.core.auth import BearerAuthMiddleware
from searchr1.core.servers import HttpServer


def _app(calls: list[int]) -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        n = len(await request.body())
        calls.append(1)
        return {"n": n}

    return app


async def test_oversized_bodies_get_413_before_the_handler():
    calls: list[int] = []
    server = HttpServer(_app(calls), max_body_bytes=1000)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            ok = await client.post("/echo", content=b"x" * 1000)
            assert ok.status_code == 200 and ok.json() == {"n": 1000}
            big = await client.post("/echo", content=b"x" * 1001)
            assert big.status_code == 413 and "1000 bytes" in big.json()["detail"]

            async def chunks():
                for _ in range(2):
                    yield b"y" * 600

            chunked = await client.post("/echo", content=chunks())  # no Content-Length
            assert chunked.status_code == 413
        assert len(calls) == 1  # neither oversized body reached the handler
    finally:
        await server.stop()


async def test_every_http_server_has_the_default_bound():
    server = HttpServer(_app([]))
    try:
        from searchr1.core._body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit

        assert isinstance(server._server.config.app, BodyLimit)
        assert server._server.config.app.max_bytes == DEFAULT_MAX_BODY_BYTES
    finally:
        server._sock.close()


def _send_head(port: int, head: str, first: bytes) -> socket.socket:
    """A raw connection that sends `head` and the first piece of its body, then stalls."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(20)  # a liveness bound on the test only: the server answers long before
    sock.sendall(head.encode() + first)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


async def test_auth_answers_before_the_body_is_read():
    """An unauthenticated chunked body that never ends gets 401 at once (the server holds none of it)."""
    import asyncio

    calls: list[int] = []
    app = _app(calls)
    app.add_middleware(BearerAuthMiddleware, token="s3cret")
    server = HttpServer(app)
    await server.start()
    try:
        head = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        sock = await asyncio.to_thread(_send_head, server.port, head, b"400\r\n" + b"z" * 1024 + b"\r\n")
        with sock:
            answer = await asyncio.to_thread(_answer, sock)
        assert answer.startswith(b"HTTP/1.1 401") and calls == []
    finally:
        await server.stop()


async def test_a_slow_body_gets_408_and_the_connection_closes():
    """An authenticated body that stalls (chunked, or short of its Content-Length) is answered 408 once
    `body_timeout_s` has passed, and the server closes the connection."""
    import asyncio

    calls: list[int] = []
    app = _app(calls)
    app.add_middleware(BearerAuthMiddleware, token="s3cret")
    server = HttpServer(app, body_timeout_s=0.5)
    await server.start()
    try:
        auth = "Authorization: Bearer s3cret\r\n"
        heads = [(f"POST /echo HTTP/1.1\r\nHost: x\r\n{auth}Transfer-Encoding: chunked\r\n\r\n", b"a\r\n0123456789\r\n"),
                 (f"POST /echo HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 100\r\n\r\n", b"0123456789")]
        for head, first in heads:
            sock = await asyncio.to_thread(_send_head, server.port, head, first)
            with sock:
                answer = await asyncio.to_thread(_answer, sock)
            assert answer.startswith(b"HTTP/1.1 408") and b"0.5 s" in answer
        assert calls == []
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer s3cret"}) as client:
            ok = await client.post("/echo", content=b"x" * 10)  # a prompt body is served as before
            assert ok.status_code == 200 and ok.json() == {"n": 10}
    finally:
        await server.stop()
