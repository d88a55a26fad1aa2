"""RetrieverClient against real gRPC servers on loopback running scripted servicers: which codes are
retried, backoff, round-robin over replicas (listed, or behind one target), skipping a failed replica,
deadlines, lazy channels."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from searchr1.core.api import retriever_pb2, retriever_pb2_grpc
from searchr1.core.clients.retriever import Hit, RetrieverClient, RetrieverError, channel_target
from searchr1.core.servers import GrpcServer
from searchr1.core.settings import RetrySettings

SERVICE = "searchr1.retriever.v1.Retriever"


class Scripted(retriever_pb2_grpc.RetrieverServicer):
    """Fails with the scripted codes first (None = answer), then answers: hit title = server name."""

    def __init__(self, name: str, script=(), delay_s: float = 0.0) -> None:
        self.name = name
        self.script = list(script)
        self.calls = 0
        self.delay_s = delay_s

    async def Search(self, request, context):
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.script:
            code = self.script.pop(0)
            if code is not None:
                await context.abort(code, f"scripted {code.name}")
        return retriever_pb2.SearchResponse(results=[
            retriever_pb2.QueryHits(hits=[retriever_pb2.Hit(doc_id=str(i), title=self.name, contents=f"{q}\nx",
                                                            score=1.0 / (i + 1)) for i in range(request.top_k)])
            for q in request.queries])


async def serve(servicer) -> GrpcServer:
    server = GrpcServer()
    server.add(retriever_pb2_grpc.add_RetrieverServicer_to_server, servicer, SERVICE)
    await server.start()
    return server


async def test_hits_in_order_and_lazy_channels():
    client = RetrieverClient(["127.0.0.1:1"])  # built outside any call: no channel yet
    assert client._channels == {}
    a = Scripted("a")
    server = await serve(a)
    try:
        async with RetrieverClient([f"127.0.0.1:{server.port}"]) as client:
            hits = await client.search(["q1", "q2"], top_k=2)
            assert hits == [[Hit("0", "a", "q1\nx", 1.0), Hit("1", "a", "q1\nx", 0.5)],
                            [Hit("0", "a", "q2\nx", 1.0), Hit("1", "a", "q2\nx", 0.5)]]
            assert await client.search([], top_k=3) == [] and a.calls == 1
    finally:
        await server.stop(0)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
async def test_retryable_codes_are_retried_with_backoff(code):
    a = Scripted("a", [code, code])
    server = await serve(a)
    try:
        async with RetrieverClient([f"127.0.0.1:{server.port}"], retry=RetrySettings(retries=2, backoff_s=0.05)) as client:
            t0 = time.perf_counter()
            hits = await client.search(["q"], top_k=1)
            assert hits[0][0].title == "a" and a.calls == 3
            assert time.perf_counter() - t0 >= 0.025 + 0.05  # backoff at least half of 0.05, then of 0.1
        a.script = [code, code]
        async with RetrieverClient([f"127.0.0.1:{server.port}"], retry=RetrySettings(retries=1, backoff_s=0.0)) as client:
            with pytest.raises(RetrieverError, match="after 2 attempts") as err:
                await client.search(["q"], 3)
            assert err.value.code == code
    finally:
        await server.stop(0)


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL,
                                  grpc.StatusCode.UNAUTHENTICATED])
async def test_other_codes_are_not_retried(code):
    a = Scripted("a", [code])
    server = await serve(a)
    try:
        async with RetrieverClient([f"127.0.0.1:{server.port}"], retry=RetrySettings(retries=3, backoff_s=0.0)) as client:
            with pytest.raises(RetrieverError, match=code.name) as err:
                await client.search(["q"], 3)
            assert err.value.code == code and a.calls == 1
    finally:
        await server.stop(0)


async def test_round_robin_and_failover_to_the_other_replica():
    a, b = Scripted("a"), Scripted("b")
    sa, sb = await serve(a), await serve(b)
    try:
        addresses = [f"127.0.0.1:{sa.port}", f"127.0.0.1:{sb.port}"]
        async with RetrieverClient(addresses, retry=RetrySettings(retries=1, backoff_s=0.0)) as client:
            titles = [(await client.search(["q"], top_k=1))[0][0].title for _ in range(4)]
            assert titles == ["a", "b", "a", "b"] and a.calls == b.calls == 2
            a.script = [grpc.StatusCode.UNAVAILABLE]
            assert (await client.search(["q"], top_k=1))[0][0].title == "b"  # a failed: retried on b
            assert a.calls == 3 and b.calls == 3
    finally:
        await sa.stop(0)
        await sb.stop(0)


async def test_one_target_resolving_to_two_replicas_is_balanced():
    a, b = Scripted("a"), Scripted("b")
    sa, sb = await serve(a), await serve(b)
    try:
        target = f"ipv4:127.0.0.1:{sa.port},127.0.0.1:{sb.port}"  # as a DNS name with two A records resolves
        async with RetrieverClient(target, retry=RetrySettings(retries=0)) as client:
            for _ in range(20):
                await client.search(["q"], top_k=1)
        assert a.calls + b.calls == 20 and a.calls >= 5 and b.calls >= 5
    finally:
        await sa.stop(0)
        await sb.stop(0)


def test_channel_targets():
    assert channel_target("retriever:50051") == "dns:///retriever:50051"
    assert channel_target("127.0.0.1:5") == "dns:///127.0.0.1:5"
    assert channel_target("ipv4:10.0.0.1:5,10.0.0.2:5") == "ipv4:10.0.0.1:5,10.0.0.2:5"
    assert channel_target("dns:///retriever:50051") == "dns:///retriever:50051"
    assert channel_target("unix:///tmp/r.sock") == "unix:///tmp/r.sock"


async def test_deadline_exceeded_then_next_replica():
    slow, fast = Scripted("slow", delay_s=2.0), Scripted("fast")
    ss, sf = await serve(slow), await serve(fast)
    try:
        async with RetrieverClient([f"127.0.0.1:{ss.port}", f"127.0.0.1:{sf.port}"], retry=RetrySettings(timeout_s=0.3, retries=1, backoff_s=0.0)) as client:
            assert (await client.search(["q"], top_k=1))[0][0].title == "fast"
            assert slow.calls == 1 and fast.calls == 1
    finally:
        await ss.stop(0)
        await sf.stop(0)


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError):
        RetrieverClient([])
    with pytest.raises(ValueError):
        RetrieverClient(["x:1"], retry=RetrySettings(timeout_s=0))
    assert RetrieverClient("127.0.0.1:5").addresses == ["127.0.0.1:5"]


def test_client_survives_a_new_event_loop():
    """Channels belong to the loop that created them; a client reused from another loop makes new ones."""
    a = Scripted("a")

    async def once(client_holder):
        server = await serve(a)
        try:
            client = client_holder.setdefault("c", RetrieverClient([f"127.0.0.1:{server.port}"]))
            client.addresses = [f"127.0.0.1:{server.port}"]
            return (await client.search(["q"], top_k=1))[0][0].title
        finally:
            await server.stop(0)

    holder: dict = {}
    assert asyncio.run(once(holder)) == "a"
    assert asyncio.run(once(holder)) == "a"
    assert a.calls == 2
