"""The viewer served on a loopback port from a background thread (its own event loop), for tests that
drive it from a real browser."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from searchr1.core.servers import HttpServer
from searchr1.viewer.app import create_app
from searchr1.viewer.settings import ViewerSettings


@contextmanager
def serve_viewer(run_dir: Path, **settings) -> Iterator[str]:
    """Serve `searchr1 view run_dir` on 127.0.0.1 (any free port); yields its base URL."""
    settings.setdefault("cache_dir", None)
    app = create_app(run_dir, ViewerSettings(port=0, **settings))
    loop = asyncio.new_event_loop()
    server = HttpServer(app, "127.0.0.1", 0)
    started = threading.Event()

    def _run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=_run, name="viewer", daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the viewer did not start")
    try:
        yield server.url
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(timeout=5), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
