"""A loopback TCP proxy that can stop forwarding without closing anything: a network partition that drops
packets (no reset, no FIN), which is what a black-holed Redis connection looks like to its client."""

from __future__ import annotations

import asyncio
import contextlib


class BlackholeProxy:
    """Forwards `127.0.0.1:<port>` to `target_host:target_port` until `blackhole()`; then bytes in either
    direction are read and dropped while every socket stays open, until `restore()`."""

    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.forwarding = True
        self.port = port
        """The port it listens on (0: a free one, known after `start`)."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> BlackholeProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def blackhole(self) -> None:
        self.forwarding = False

    def restore(self) -> None:
        self.forwarding = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                if self.forwarding:  # black-holed: the bytes are lost, the connection stays up
                    dst.write(data)
                    await dst.drain()
        dst.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
