"""Server helpers: gRPC health + reflection + bearer auth, HTTP on port 0, metrics endpoint."""

from __future__ import annotations

import grpc
import httpx
import pytest
from fastapi import FastAPI
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import Counter

from searchr1.core.api import retriever_pb2, retriever_pb2_grpc
from searchr1.core.auth import BearerAuthMiddleware, grpc_metadata
from searchr1.core.metrics import new_registry, start_metrics_server
from searchr1.core.servers import GrpcServer, HttpServer, port_is_free


class EchoRetriever(retriever_pb2_grpc.RetrieverServicer):
    async def Search(self, request, context):
        return retriever_pb2.SearchResponse(
            results=[retriever_pb2.QueryHits(hits=[retriever_pb2.Hit(doc_id="0", title=q, contents=q, score=1.0)])
                     for q in request.queries])


async def _start(token=None) -> GrpcServer:
    server = GrpcServer(token=token)
    server.add(retriever_pb2_grpc.add_RetrieverServicer_to_server, EchoRetriever(),
               "searchr1.retriever.v1.Retriever")
    await server.start()
    return server


async def test_grpc_health_and_auth():
    server = await _start(token="s3cret")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            hs = health_pb2_grpc.HealthStub(ch)
            for name in ("", "searchr1.retriever.v1.Retriever"):
                resp = await hs.Check(health_pb2.HealthCheckRequest(service=name))  # open without token
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            stub = retriever_pb2_grpc.RetrieverStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Search(retriever_pb2.SearchRequest(queries=["a"], top_k=1))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            resp = await stub.Search(retriever_pb2.SearchRequest(queries=["a", "b"], top_k=1),
                                     metadata=grpc_metadata("s3cret"))
            assert [r.hits[0].title for r in resp.results] == ["a", "b"]
    finally:
        await server.stop(0)


async def test_grpc_not_serving_during_shutdown():
    server = await _start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    hs = health_pb2_grpc.HealthStub(ch)
    await server._health.enter_graceful_shutdown()
    resp = await hs.Check(health_pb2.HealthCheckRequest(service=""))
    assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
    await ch.close()
    await server.stop(0)


async def test_http_server_port0_with_auth_and_metrics():
    app = FastAPI()

    @app.get("/healthz")
    async def health():
        return {"status": "ok"}

    @app.post("/v1/thing")
    async def thing():
        return {"ok": True}

    server = HttpServer(BearerAuthMiddleware(app, "tok"))
    await server.start()
    assert not port_is_free("127.0.0.1", server.port)
    reg = new_registry()
    Counter("searchr1_test_requests_total", "test", registry=reg).inc(3)
    metrics = start_metrics_server(reg)
    try:
        async with httpx.AsyncClient(base_url=server.url) as c:
            assert (await c.get("/healthz")).json() == {"status": "ok"}
            assert (await c.post("/v1/thing")).status_code == 401
            assert (await c.post("/v1/thing", headers={"Authorization": "Bearer tok"})).json() == {"ok": True}
        async with httpx.AsyncClient() as c:
            text = (await c.get(f"http://127.0.0.1:{metrics.port}/metrics")).text
            assert "searchr1_test_requests_total 3.0" in text
    finally:
        metrics.close()
        await server.stop()


def test_http_server_refuses_taken_port():
    import socket

    app = FastAPI()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError, match="cannot bind"):
            HttpServer(app, port=s.getsockname()[1])


async def test_grpc_reflection_needs_the_token():
    """The service's schema is not handed to whoever asks: reflection is behind the token like any call."""
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    server = await _start(token="s3cret")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            ask = [reflection_pb2.ServerReflectionRequest(list_services="")]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stub.ServerReflectionInfo(iter(ask)):
                    pass
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            names = []
            async for reply in stub.ServerReflectionInfo(iter(ask), metadata=grpc_metadata("s3cret")):
                names += [s.name for s in reply.list_services_response.service]
            assert "searchr1.retriever.v1.Retriever" in names
    finally:
        await server.stop(0)
