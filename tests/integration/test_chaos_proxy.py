"""The soak's link proxy (tests/faults/chaos_proxy.py) on loopback against a real echo server: bytes arrive
whole and in order through jitter and loss, a partition holds them without losing any, the connection
bound refuses the excess, and only loopback/private addresses are served."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.faults.chaos_proxy import ChaosProxy, LinkShape


async def _echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()
    return await asyncio.start_server(echo, "127.0.0.1", 0)


async def _proxy(server: asyncio.Server, **kw) -> ChaosProxy:
    return await ChaosProxy(("127.0.0.1", server.sockets[0].getsockname()[1]), **kw).start()


async def test_bytes_arrive_whole_and_in_order_through_jitter_and_loss():
    server = await _echo_server()
    proxy = await _proxy(server, shape=LinkShape(latency_ms=2, jitter_ms=2, loss=0.3, rto_ms=5), seed=1)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    payload = os.urandom(3 * 1024 * 1024)
    for i in range(0, len(payload), 50_000):  # many chunks, each with its own delay draw
        writer.write(payload[i:i + 50_000])
    await writer.drain()
    got = await asyncio.wait_for(reader.readexactly(len(payload)), 60)
    assert got == payload
    writer.close()
    await proxy.close()
    server.close()


async def test_a_partition_holds_bytes_and_loses_none():
    server = await _echo_server()
    proxy = await _proxy(server)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"before")
    assert await asyncio.wait_for(reader.readexactly(6), 10) == b"before"
    proxy.pause()
    writer.write(b"during the partition")
    await writer.drain()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read(100), 0.5)  # nothing crosses a paused link
    proxy.resume()
    assert await asyncio.wait_for(reader.readexactly(20), 10) == b"during the partition"
    writer.close()
    await proxy.close()
    server.close()


async def test_connections_past_the_bound_are_closed():
    server = await _echo_server()
    proxy = await _proxy(server, max_connections=2)
    kept = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(2)]
    for r, w in kept:  # both forwarded
        w.write(b"x")
        assert await asyncio.wait_for(r.readexactly(1), 10) == b"x"
    r3, w3 = await asyncio.open_connection("127.0.0.1", proxy.port)
    assert await asyncio.wait_for(r3.read(10), 10) == b""  # closed at once
    assert proxy.refused == 1
    for _, w in [*kept, (r3, w3)]:
        w.close()
    await proxy.close()
    server.close()


def test_only_loopback_or_private_addresses():
    with pytest.raises(ValueError, match="only serves loopback or private"):
        ChaosProxy(("8.8.8.8", 53))
    with pytest.raises(ValueError, match="only serves loopback or private"):
        ChaosProxy(("127.0.0.1", 53), listen_host="0.0.0.0")
    ChaosProxy(("10.201.0.1", 6379), listen_host="10.201.0.2")
