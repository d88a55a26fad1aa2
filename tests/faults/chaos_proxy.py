"""A small userspace TCP proxy for the soak: latency, "loss" and partitions on one link between a client and
a server, on loopback or network-namespace addresses only (these kernels have no `tc netem`).

Each chunk read from one side is delivered to the other after `latency_ms` ± `jitter_ms`, in order (a
chunk never overtakes the one before it). TCP hides a lost packet from the application as a stall of one
retransmission timeout, with the chunks behind it waiting (head-of-line blocking): that is what `loss`
does — with probability `loss` a chunk is held an extra `rto_ms` first. A partition (`pause()`) stops
forwarding and opening upstream connections without closing or dropping anything, until `resume()`:
the bytes wait, as they wait in a sender's retransmission queue, and the clients' own timeouts decide
whether a connection survives it.

Bounded: at most `max_connections` client connections (more are closed at once), at most `queue_chunks`
chunks of 64 KiB held per direction (the reader waits when the queue is full).

`python -m tests.faults.chaos_proxy --listen HOST:PORT --target HOST:PORT` runs a plain relay (no latency)
in the foreground: the soak starts one inside each host's network namespace (`tests/faults/netns.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import random
import time
from dataclasses import dataclass

CHUNK = 65536


@dataclass
class LinkShape:
    """What one link does to its bytes (mutable while it runs)."""

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    """Probability that a chunk waits one retransmission timeout (`rto_ms`) before delivery."""
    rto_ms: float = 200.0


def check_local(host: str) -> None:
    """Only loopback and private (network-namespace) addresses: the proxy never reaches out."""
    addr = ipaddress.ip_address(host)
    if addr.is_unspecified or not (addr.is_loopback or addr.is_private):
        raise ValueError(f"the chaos proxy only serves loopback or private addresses, not {host}")


class ChaosProxy:
    """Forwards `listen_host:port` to `target` with the link's `shape`; `pause()`/`resume()` a partition."""

    def __init__(self, target: tuple[str, int], *, listen_host: str = "127.0.0.1", port: int = 0,
                 shape: LinkShape | None = None, seed: int = 0, max_connections: int = 256,
                 queue_chunks: int = 16, connect_timeout_s: float = 10.0) -> None:
        check_local(listen_host)
        check_local(target[0])
        self.target = target
        self.listen_host, self.port = listen_host, port
        self.shape = shape or LinkShape()
        self.rng = random.Random(seed)
        self.max_connections, self.queue_chunks = max_connections, queue_chunks
        self.connect_timeout_s = connect_timeout_s
        self.connections = 0
        self.refused = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> ChaosProxy:
        self._server = await asyncio.start_server(self._accept, self.listen_host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    @property
    def paused(self) -> bool:
        return not self._flowing.is_set()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= self.max_connections:
            self.refused += 1
            writer.close()
            return
        self.connections += 1
        try:
            await self._flowing.wait()
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.target),
                                                              self.connect_timeout_s)
            except (TimeoutError, OSError):
                return
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                                 return_exceptions=True)
            for w in (up_writer, writer):
                w.close()
        finally:
            self.connections -= 1
            writer.close()

    def _delay_s(self) -> float:
        s = self.shape
        delay = max(0.0, s.latency_ms + self.rng.uniform(-s.jitter_ms, s.jitter_ms)) / 1000.0
        if s.loss and self.rng.random() < s.loss:
            delay += s.rto_ms / 1000.0
        return delay

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """One direction: a reader task queues (due time, chunk), a writer task delivers in order."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(self.queue_chunks)

        async def read() -> None:
            due = 0.0
            try:
                while data := await src.read(CHUNK):
                    due = max(due, time.monotonic() + self._delay_s())
                    await queue.put((due, data))
            except (ConnectionError, OSError):
                pass
            finally:
                await queue.put(None)

        async def write() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while (item := await queue.get()) is not None:
                    due, data = item
                    if (wait := due - time.monotonic()) > 0:
                        await asyncio.sleep(wait)
                    await self._flowing.wait()
                    dst.write(data)
                    await dst.drain()
                if dst.can_write_eof():
                    dst.write_eof()

        reader = self._spawn(read())
        try:
            await write()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _relay(listen: tuple[str, int], target: tuple[str, int]) -> None:
    proxy = await ChaosProxy(target, listen_host=listen[0], port=listen[1]).start()
    print(f"relay {listen[0]}:{proxy.port} -> {target[0]}:{target[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="A plain TCP relay between loopback/private addresses.")
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    args = parser.parse_args()
    asyncio.run(_relay(_address(args.listen), _address(args.target)))


if __name__ == "__main__":
    main()
