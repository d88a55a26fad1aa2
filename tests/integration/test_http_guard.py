"""The HTTP servers' connection guard (`searchr1.core._http_guard`) over real sockets on loopback: request
heads that never finish are closed at their deadline (dripped bytes do not extend it), idle connections
give way to new ones past the bound, busy ones are never closed for a newcomer; and a real `searchr1 serve
reward` at a 1,024-descriptor limit flooded with 1,500 idle request heads keeps answering `/healthz` with
a log that does not grow, against the same app served by uvicorn as it comes (the baseline, measured in
the same run and printed, not asserted)."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from searchr1.core.servers import HttpServer, free_port

PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"  # the blank line that ends it never comes
BASELINE = Path(__file__).parents[1] / "support" / "reward_unguarded.py"


def app_with_gate(gate: asyncio.Event | None = None) -> FastAPI:
    app = FastAPI()

    @app.get("/hello")
    async def hello():
        if gate is not None:
            await gate.wait()
        return {"hello": True}

    @app.get("/ping")
    async def ping():
        return {"ping": True}

    return app


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> float | None:
    """Seconds until the server closes the connection (reads whatever it sends); None if it stays open."""
    t0 = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(4096), timeout=max(0.01, seconds - (time.monotonic() - t0))):
            pass
    except TimeoutError:
        return None
    except ConnectionError:
        pass
    return time.monotonic() - t0


async def test_request_heads_time_out_and_drips_do_not_extend_them():
    server = HttpServer(app_with_gate(), head_timeout_s=0.6)
    await server.start()
    try:
        silent = await asyncio.open_connection("127.0.0.1", server.port)
        partial = await asyncio.open_connection("127.0.0.1", server.port)
        partial[1].write(PARTIAL_HEAD)
        drip = await asyncio.open_connection("127.0.0.1", server.port)

        async def dripping() -> None:
            for byte in PARTIAL_HEAD:
                drip[1].write(bytes([byte]))
                await asyncio.sleep(0.05)  # a byte every 50 ms: 1.6 s for the head, past its 0.6 s

        dripper = asyncio.create_task(dripping())
        waits = await asyncio.gather(*(closed_within(r, 5.0) for r, _ in (silent, partial, drip)))
        dripper.cancel()
        assert all(w is not None and w < 3.0 for w in waits), waits
        assert server.guard.counts.timed_out == 3
        # a keep-alive connection: its first request answered, then a head that stalls is closed too
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b"}")).startswith(b"HTTP/1.1 200")
        writer.write(b"GET /hel")
        assert await closed_within(reader, 5.0) is not None
        for _, w in (silent, partial, drip, (reader, writer)):
            w.close()
        async with httpx.AsyncClient() as client:  # a prompt client is answered throughout
            assert (await client.get(f"{server.url}/hello", timeout=10)).json() == {"hello": True}
    finally:
        await server.stop()


async def test_idle_connections_give_way_and_busy_ones_are_kept():
    gate = asyncio.Event()
    server = HttpServer(app_with_gate(gate), max_connections=8, head_timeout_s=60)
    await server.start()
    try:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=4)) as client:
            busy = [asyncio.create_task(client.get(f"{server.url}/hello", timeout=30)) for _ in range(4)]
            while server.guard.open_connections < 4:
                await asyncio.sleep(0.01)
            idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(50)]
            while server.guard.counts.evicted < 50 - 4:
                await asyncio.sleep(0.01)
            assert server.guard.open_connections <= 8
            async with httpx.AsyncClient() as prompt:  # each prompt request makes room by closing an idle one
                for _ in range(10):
                    assert (await prompt.get(f"{server.url}/ping", timeout=10)).status_code == 200
            gate.set()
            assert [r.status_code for r in await asyncio.gather(*busy)] == [200] * 4  # never closed
            for _, w in idle:
                w.close()
        # every connection busy: a newcomer is closed at once
        gate.clear()
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=8)) as client:
            busy = [asyncio.create_task(client.get(f"{server.url}/hello", timeout=30)) for _ in range(8)]
            while server.guard.open_connections < 8 or len(server._server.server_state.tasks) < 8:
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            assert await closed_within(reader, 5.0) is not None
            assert server.guard.counts.refused >= 1
            writer.close()
            gate.set()
            assert [r.status_code for r in await asyncio.gather(*busy)] == [200] * 8
    finally:
        gate.set()
        await server.stop()


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def _answers_healthz(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.settimeout(2)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def flood(pid: int, port: int, log: Path, idle: int, seconds: float) -> dict[str, float]:
    """Hold `idle` half-sent request heads open and probe `/healthz` every 0.1 s for `seconds`: the share
    answered, the log's growth and the server's most open descriptors."""
    size0, held, failed = log.stat().st_size, [], 0
    for _ in range(idle):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(PARTIAL_HEAD)
            held.append(s)
        except OSError:
            failed += 1
    t0, probes, answered, fds = time.monotonic(), 0, 0, 0
    try:
        while time.monotonic() - t0 < seconds:
            probes += 1
            answered += _answers_healthz(port)
            fds = max(fds, len(os.listdir(f"/proc/{pid}/fd")))
            time.sleep(0.1)
    finally:
        for s in held:
            s.close()
    return {"answered": answered / probes, "probes": probes, "log_bytes": log.stat().st_size - size0,
            "fds": fds, "connect_failures": failed}


def serve(cmd: list[str], port: int, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_limit_descriptors)
    deadline = time.monotonic() + 120
    while not _answers_healthz(port):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    return proc


def test_a_flood_of_idle_heads_does_not_shut_the_reward_service_out(tmp_path):
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096:
        pytest.skip("the test holds 1,500 connections: it needs a descriptor limit of 4,096")
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    figures = {}
    runs = {"uvicorn as it comes (baseline)": [sys.executable, str(BASELINE)],
            "searchr1 serve reward": [sys.executable, "-m", "searchr1.cli", "serve", "reward", "--insecure-no-auth",
                                      "--port"]}
    for name, cmd in runs.items():
        port, log = free_port(), tmp_path / f"{len(figures)}.log"
        proc = serve([*cmd, str(port)], port, log)
        try:
            figures[name] = flood(proc.pid, port, log, idle=1500, seconds=4.0)
        finally:
            proc.kill()
            proc.wait()
    print("\n1,500 idle request heads at a 1,024-descriptor limit, /healthz every 0.1 s for 4 s:")
    for name, f in figures.items():
        print(f"  {name}: {f['answered']:.0%} of {f['probes']} probes answered, log +{f['log_bytes'] / 1e6:.2f} MB, "
              f"at most {f['fds']} descriptors open")
    guarded = figures["searchr1 serve reward"]
    assert guarded["answered"] >= 0.9
    assert guarded["log_bytes"] < 16_000  # one summary line of what the guard closed, at most a few
    assert guarded["fds"] < 1024
