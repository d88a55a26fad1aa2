"""The viewer served on a loopback port from a background thread (its own event loop), for tests that
drive it from a real browser."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from searchr1.core.servers import HttpServer
from searchr1.viewer.app import create_app
from searchr1.viewer.settings import ViewerSettings


@contextmanager
def serve_viewer(run_dir: Path | None, *, asker: Callable[[], Any] | None = None,
                 ask_info: dict[str, str] | None = None, **settings) -> Iterator[str]:
    """Serve `searchr1 view run_dir` on 127.0.0.1 (any free port); yields its base URL. `asker`: a factory of
    an async context manager yielding the ask page's asker, entered on the viewer's loop (its engine lives
    there, as under `searchr1 view --model`)."""
    settings.setdefault("cache_dir", None)
    loop = asyncio.new_event_loop()
    box: dict[str, Any] = {}
    started = threading.Event()

    def _run() -> None:
        asyncio.set_event_loop(loop)
        try:
            opened = asker() if asker is not None else None
            box["opened"] = opened
            handle = loop.run_until_complete(opened.__aenter__()) if opened is not None else None
            app = create_app(run_dir, ViewerSettings(port=0, **settings), asker=handle, ask_info=ask_info)
            box["server"] = server = HttpServer(app, "127.0.0.1", 0)
            loop.run_until_complete(server.start())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            box["error"] = exc
            started.set()
            return
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=_run, name="viewer", daemon=True)
    thread.start()
    if not started.wait(600) or "error" in box:
        raise RuntimeError(f"the viewer did not start: {box.get('error')!r}")
    server = box["server"]
    try:
        yield server.url
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(timeout=5), loop).result(30)
        if box.get("opened") is not None:
            asyncio.run_coroutine_threadsafe(box["opened"].__aexit__(None, None, None), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
