"""Size limits before work, over real HTTP on loopback: a body over the server's bound is answered 413
without the handler running (declared by Content-Length, or streamed chunked without one); a body
within it is served; every service's HTTP server has the bound by default."""

from __future__ import annotations

import httpx
from fastapi import FastAPI, Request

from searchr1.core.servers import HttpServer


def _app(calls: list[int]) -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        calls.append(1)
        return {"n": len(await request.body())}

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
        from searchr1.core.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit

        assert isinstance(server._server.config.app, BodyLimit)
        assert server._server.config.app.max_bytes == DEFAULT_MAX_BODY_BYTES
    finally:
        server._sock.close()
