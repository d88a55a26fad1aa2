"""Background work of the servers is supervised (searchr1.core.supervise): an HTTP server's serve task that
ends, a retriever micro-batcher whose loop dies, a metrics server whose serve thread dies — each ends the
service's wait with `TaskDied` naming it, instead of a process that stays up and deaf. Real servers on
loopback."""

from __future__ import annotations

import asyncio
import socket

import httpx
import numpy as np
import pytest

from searchr1.core.metrics import start_metrics_server
from searchr1.core.servers import HttpServer
from searchr1.core.supervise import Supervisor, TaskDied
from searchr1.retriever.batcher import MicroBatcher
from searchr1.retriever.indexes import Ranked
from searchr1.retriever.settings import BatchSettings, LimitSettings


async def _app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_an_http_server_that_stops_serving_stops_the_service():
    server = HttpServer(_app, "127.0.0.1", 0)
    await server.start()
    sup = Supervisor("reward")
    sup.watch("http server", server.task)
    async with httpx.AsyncClient(trust_env=False) as client:
        assert (await client.get(server.url)).status_code == 200
    server._server.should_exit = True  # uvicorn's serve loop ends on its own, the process would stay up
    with pytest.raises(TaskDied, match="reward: background task 'http server' died \\(it returned"):
        await asyncio.wait_for(sup.wait(asyncio.Event()), 10)
    await sup.close()
    await server.stop()


async def test_a_clean_stop_is_no_death():
    server = HttpServer(_app, "127.0.0.1", 0)
    await server.start()
    sup = Supervisor("viewer")
    sup.watch("http server", server.task)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.1, stop.set)
    await asyncio.wait_for(sup.wait(stop), 10)
    await sup.close()
    await server.stop()
    assert sup.failure is None


class _Fatal(BaseException):
    """Escapes `except Exception` (as a KeyboardInterrupt in the search thread would)."""


async def test_a_retriever_batcher_whose_loop_dies_stops_the_retriever():
    def search(queries, k):
        if queries == ["boom"]:
            raise _Fatal("the search thread died")
        return Ranked(np.zeros((len(queries), 1), dtype=np.int64), np.ones((len(queries), 1), dtype=np.float32))

    batcher = MicroBatcher(search, BatchSettings(max_queries=4, max_wait_ms=0), LimitSettings())
    await batcher.start()
    sup = Supervisor("retriever")
    sup.watch("micro-batcher", batcher.task)
    assert await batcher.search(["fine"], 1) == [[(0, 1.0)]]
    caller = asyncio.create_task(batcher.search(["boom"], 1))
    with pytest.raises(TaskDied, match="'micro-batcher' died \\(_Fatal: the search thread died\\)"):
        await asyncio.wait_for(sup.wait(asyncio.Event()), 10)
    caller.cancel()
    await sup.close()
    await batcher.stop()


async def test_a_metrics_server_whose_thread_dies_stops_the_service():
    sup = Supervisor("learner")
    sup.bind()
    ms = start_metrics_server(__import__("prometheus_client").CollectorRegistry(), "127.0.0.1", 0,
                              ready=lambda: True, on_death=sup.fail)
    with socket.create_connection(("127.0.0.1", ms.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert b"200 OK" in s.recv(1024)

    def broken() -> None:  # a fault in the serve loop itself (its requests' errors are handled per request)
        raise OSError("the selector failed")

    ms.server.service_actions = broken
    with pytest.raises(TaskDied, match="'metrics server' died \\(OSError: the selector failed\\)"):
        await asyncio.wait_for(sup.wait(asyncio.Event()), 10)
    ms.closing.set()
    ms.thread.join(5)


async def test_a_supervised_grpc_server_stops_cleanly_after_its_supervisor():
    """The retriever's order at SIGTERM: the supervisor closes (cancelling its wait on the gRPC server),
    then the server stops with its grace — without CancelledError, and without a death recorded."""
    from searchr1.core.servers import GrpcServer

    server = GrpcServer("127.0.0.1", 0)
    await server.start()
    sup = Supervisor("retriever")
    sup.spawn("grpc server", server.wait())
    await asyncio.sleep(0.1)
    await sup.close()
    await server.stop(1.0)
    assert sup.failure is None
