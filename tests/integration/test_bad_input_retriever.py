"""Bad input against the real retriever on loopback (a BM25 index built in the test, gRPC and HTTP servers
on port 0): raw gRPC requests that are empty, oversized or carry non-UTF-8 bytes in a string field are
refused with a status and a message, and the server keeps answering good requests afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import httpx
import pytest

from searchr1.core.api import retriever_pb2
from searchr1.retriever.builder import build_index
from searchr1.retriever.loading import load_index
from searchr1.retriever.server import start_retriever
from searchr1.retriever.settings import RetrieverSettings

SEARCH = "/searchr1.retriever.v1.Retriever/Search"
FACTS = [("Moon", "The Moon is Earth's only natural satellite."),
         ("Nile", "The Nile is a major north-flowing river in northeastern Africa."),
         ("Chess", "Chess is a board game for two players.")]
MAX_MESSAGE = 1 << 16


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("retriever")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n"
                              for i, (t, x) in enumerate(FACTS)))
    build_index(corpus, root / "bm25", "bm25")
    return root / "bm25"


@pytest.fixture
async def running(bm25_index):
    settings = RetrieverSettings(grpc_port=0, http_port=0, index=bm25_index, max_message_bytes=MAX_MESSAGE)
    running = await start_retriever(settings, load_index(bm25_index, encoder_factory=None))
    yield running
    await running.stop()


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2); payloads here stay under 128 bytes."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


async def call_raw(address: str, body: bytes) -> grpc.aio.AioRpcError | bytes:
    async with grpc.aio.insecure_channel(address) as channel:
        method = channel.unary_unary(SEARCH)  # no serializers: raw bytes both ways
        try:
            return await method(body, timeout=30)
        except grpc.aio.AioRpcError as exc:
            return exc


async def assert_still_serving(address: str) -> None:
    good = retriever_pb2.SearchRequest(queries=["moon"], top_k=1).SerializeToString()
    answer = await call_raw(address, good)
    assert isinstance(answer, bytes), answer
    assert retriever_pb2.SearchResponse.FromString(answer).results[0].hits[0].doc_id == "0"


async def test_empty_request_is_invalid_argument(running):
    err = await call_raw(running.grpc_address, b"")
    assert isinstance(err, grpc.aio.AioRpcError)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "no queries" in err.details()
    await assert_still_serving(running.grpc_address)


async def test_non_utf8_query_is_invalid_argument(running):
    body = field(1, b"caf\xe9 \xff\xfe") + bytes([2 << 3, 3])  # queries=[<latin-1 bytes>], top_k=3
    err = await call_raw(running.grpc_address, body)
    assert isinstance(err, grpc.aio.AioRpcError)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert "UTF-8" in err.details() or "utf-8" in err.details()
    await assert_still_serving(running.grpc_address)


async def test_garbage_bytes_are_invalid_argument(running):
    err = await call_raw(running.grpc_address, b"\xff\xff\xff\xff\x0f")
    assert isinstance(err, grpc.aio.AioRpcError)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details()
    await assert_still_serving(running.grpc_address)


async def test_oversized_requests_are_refused_with_a_message(running):
    # a message over the server's size limit: refused by gRPC before it is parsed
    huge = retriever_pb2.SearchRequest(queries=["x" * MAX_MESSAGE], top_k=1).SerializeToString()
    err = await call_raw(running.grpc_address, huge)
    assert isinstance(err, grpc.aio.AioRpcError)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and str(MAX_MESSAGE) in err.details()
    # under the size limit but over the request bounds: INVALID_ARGUMENT naming the bound
    limits = running.service.limits
    for request, msg in [
        (retriever_pb2.SearchRequest(queries=["y" * (limits.max_query_chars + 1)], top_k=1), "characters"),
        (retriever_pb2.SearchRequest(queries=["z"] * (limits.max_queries + 1), top_k=1), "at most"),
        (retriever_pb2.SearchRequest(queries=["moon"], top_k=2**31 - 1), "top_k"),
    ]:
        err = await call_raw(running.grpc_address, request.SerializeToString())
        assert isinstance(err, grpc.aio.AioRpcError)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and msg in err.details(), err.details()
    await assert_still_serving(running.grpc_address)


async def test_http_non_utf8_and_empty_bodies_are_422(running):
    async with httpx.AsyncClient(base_url=running.http.url, timeout=30) as http:
        for body in (b"", b'{"queries": ["caf\xe9"]}', b"\xff\xfe\x00"):
            r = await http.post("/retrieve", content=body)
            assert r.status_code == 422 and r.json()["detail"], (body, r.text)


async def test_requests_past_what_the_limits_allow_are_refused_unparsed(bm25_index):
    """The receive limits follow the request bounds: with 2 queries of 10 characters at most, a 100 KB
    request is refused by gRPC (RESOURCE_EXHAUSTED) and by HTTP (413) before any parsing, though it is
    far under `max_message_bytes`."""
    settings = RetrieverSettings(grpc_port=0, http_port=0, index=bm25_index,
                                 limits={"max_queries": 2, "max_query_chars": 10})
    assert settings.limits.request_bytes() < 100_000 < settings.max_message_bytes
    running = await start_retriever(settings, load_index(bm25_index, encoder_factory=None))
    try:
        big = retriever_pb2.SearchRequest(queries=["x" * 100_000], top_k=1).SerializeToString()
        err = await call_raw(running.grpc_address, big)
        assert isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        async with httpx.AsyncClient(base_url=running.http.url) as client:
            r = await client.post("/retrieve", json={"queries": ["x" * 100_000], "topk": 1})
            assert r.status_code == 413
        await assert_still_serving(running.grpc_address)
    finally:
        await running.stop()
