"""gRPC callers without the token cannot make the server hold their requests: against a real gRPC
server on loopback built as the retriever builds its own (`GrpcServer`, a token, the receive limit of the
retriever's default bounds; `tests/support/auth_flood_server.py`), in a process of its own whose RSS is
read from /proc.

A flood of large unauthenticated `Search` calls (each just under the receive limit, 12.6 MB at the
default bounds) is refused UNAUTHENTICATED before any message is read; the same flood against the
baseline — the same server whose token check runs once gRPC has received the whole message — is
measured in the same run and printed beside it (not asserted: it depends on the machine). Health checks,
open without the token, are read a few at a time, and one that never finishes sending is cut off."""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from searchr1.core.api import retriever_pb2
from searchr1.core.auth import BearerAuthInterceptor
from searchr1.core.servers import GrpcServer
from searchr1.retriever.settings import RetrieverSettings

SEARCH = "/searchr1.retriever.v1.Retriever/Search"
CHECK = "/grpc.health.v1.Health/Check"
TOKEN = "flood-test-token"
SERVER = Path(__file__).parents[1] / "support" / "auth_flood_server.py"
CALLS = 48


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def largest_request() -> bytes:
    """Bytes just under the retriever's default receive limit (what an attacker sends: no need to parse)."""
    return b"\x0a" + b"x" * (RetrieverSettings().limits.request_bytes() - 100)


async def flood(pid: int, address: str, method: str, body: bytes, calls: int) -> tuple[dict[str, int], float]:
    """`calls` concurrent calls without the token; returns their status counts and the server's peak RSS
    growth in MiB (sampled every 20 ms from before the first call until 1 s after the last answer)."""
    before = rss_mib(pid)
    peak = before
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        call = ch.unary_unary(method)

        async def one() -> str:
            try:
                await call(body, timeout=120)
                return "OK"
            except grpc.aio.AioRpcError as exc:
                return exc.code().name

        tasks = [asyncio.create_task(one()) for _ in range(calls)]
        while not all(t.done() for t in tasks):
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.02)
        for _ in range(50):
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.02)
    codes = [t.result() for t in tasks]
    return {c: codes.count(c) for c in sorted(set(codes))}, peak - before


async def authenticated_search(address: str) -> str:
    async with grpc.aio.insecure_channel(address) as ch:
        answer = await ch.unary_unary(SEARCH)(
            retriever_pb2.SearchRequest(queries=["moon"], top_k=1).SerializeToString(),
            metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=30)
    return retriever_pb2.SearchResponse.FromString(answer).results[0].hits[0].doc_id


async def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(SERVER), TOKEN, *flags], stdout=subprocess.PIPE, text=True)
    address = await asyncio.to_thread(proc.stdout.readline)  # type: ignore[union-attr]
    assert address.strip(), f"the server did not start (exit {proc.poll()})"
    return proc, address.strip()


async def test_unauthenticated_large_calls_are_refused_unread():
    body = largest_request()
    figures = {}
    for name, flags in (("read before auth (baseline)", ("--read-before-auth",)), ("auth before read", ())):
        proc, address = await start_server(*flags)
        try:
            await authenticated_search(address)  # warm: the first call's allocations are not the flood's
            codes, growth = await flood(proc.pid, address, SEARCH, body, CALLS)
            assert codes == {"UNAUTHENTICATED": CALLS}, codes
            assert await authenticated_search(address) == "4"  # still serving the token's holders
            figures[name] = growth
        finally:
            proc.kill()
            proc.wait()
    print(f"\n{CALLS} unauthenticated calls of {len(body) / 1e6:.1f} MB: server RSS peak growth "
          + ", ".join(f"{k} {v:.0f} MiB" for k, v in figures.items()))
    assert figures["auth before read"] < 128  # measured: 3 MiB (a window of 64 KiB a call at most)


async def test_unauthenticated_health_checks_are_read_a_few_at_a_time():
    """Large health checks without the token: at most `max_open_calls` (4) are read at once, the rest are
    RESOURCE_EXHAUSTED unread; probes still get SERVING."""
    proc, address = await start_server()
    try:
        codes, growth = await flood(proc.pid, address, CHECK, largest_request(), 40)
        print(f"\n40 unauthenticated health checks of 12.6 MB: {codes}, server RSS peak growth {growth:.0f} MiB")
        assert set(codes) <= {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}, codes  # read ones do not parse
        assert growth < 4 * 12.6 * 8  # 4 read at once, each held a few times over while parsed
        async with grpc.aio.insecure_channel(address) as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.kill()
        proc.wait()


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman coding (both under 127 bytes)."""
    return bytes([0, len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


async def stalled_health_check(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open an HTTP/2 connection by hand and start a health check whose message never finishes: its
    length prefix says 100 bytes, 10 are sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    headers = b"".join(_literal(k, v) for k, v in ((":method", "POST"), (":scheme", "http"), (":path", CHECK),
                                                   (":authority", "localhost"), ("content-type", "application/grpc"),
                                                   ("te", "trailers")))
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"") + _frame(1, 4, 1, headers)
                 + _frame(0, 0, 1, b"\x00" + struct.pack(">I", 100) + b"x" * 10))
    await writer.drain()
    return reader, writer


async def stream_ended(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Read frames until stream 1 ends (trailers with END_STREAM, or RST_STREAM); False if the connection
    closes first."""
    while True:
        try:
            head = await reader.readexactly(9)
        except asyncio.IncompleteReadError:
            return False
        length, kind, flags, stream = int.from_bytes(head[:3], "big"), head[3], head[4], \
            int.from_bytes(head[5:], "big") & 0x7FFFFFFF
        await reader.readexactly(length)
        if kind == 4 and not flags & 1:  # the server's SETTINGS: acknowledge them
            writer.write(_frame(4, 1, 0, b""))
        if stream == 1 and (kind == 3 or (kind == 1 and flags & 1)):
            return True


async def test_a_health_check_that_never_finishes_sending_is_cut_off():
    """Two stalled unauthenticated health checks fill `max_open_calls` = 2: a third is RESOURCE_EXHAUSTED;
    both are ended at `open_read_timeout_s`, and probes are served again."""
    guard = BearerAuthInterceptor(TOKEN, max_open_calls=2, open_read_timeout_s=0.5)
    server = GrpcServer(interceptors=[guard], reflection_enabled=False)
    port = await server.start()
    try:
        stalled = [await stalled_health_check(port) for _ in range(2)]
        t0 = time.monotonic()
        while guard.open_calls < 2 and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.01)
        assert guard.open_calls == 2
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            ended = await asyncio.wait_for(asyncio.gather(*(stream_ended(r, w) for r, w in stalled)), 10)
            assert ended == [True, True]
            t0 = time.monotonic()  # the server's handler leaves its call slot just after the stream ends
            while guard.open_calls and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.01)
            assert guard.open_calls == 0
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        for _, w in stalled:
            w.close()
    finally:
        await server.stop(0)
