"""A snapshot directory served the way the learner's weight server serves version 1 (`GET
/weights/1/files` lists it, `GET /weights/1/files/{name}` returns a file), on a loopback `HttpServer`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse

from searchr1.core.servers import HttpServer
from searchr1.weightsync import snapshot_listing


@contextlib.asynccontextmanager
async def serve_snapshot(snap: Path) -> AsyncIterator[str]:
    """Serve `snap`; yields the base URL of its version 1 (`…/weights/1`)."""
    app = FastAPI()

    @app.get("/weights/1/files")
    async def files():
        return snapshot_listing(snap)

    @app.get("/weights/1/files/{name:path}")
    async def file(name: str):
        return FileResponse(snap / name)

    server = HttpServer(app)
    await server.start()
    try:
        yield f"{server.url}/weights/1"
    finally:
        await server.stop()
