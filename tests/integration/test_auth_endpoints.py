"""With a token configured, every HTTP and gRPC call without it is refused — each endpoint of the real
servers on loopback: the retriever (gRPC Search, HTTP /retrieve, /metrics when closed), the reward service
(/v1/score, /v1/scorers, /metrics when closed), the learner's weight file server (the files protocol,
fetched by the worker's own download code), and the metrics ports of the learner and of a rollout worker
when closed. Health stays open so probes work without the secret."""

from __future__ import annotations

import asyncio
import json

import grpc
import httpx
import pytest

from searchr1.core.api import retriever_pb2, retriever_pb2_grpc
from searchr1.core.clients.retriever import RetrieverClient, RetrieverError
from searchr1.core.clients.reward import RewardClient, RewardError
from searchr1.core.schemas import WeightVersion
from searchr1.core.servers import HttpServer, free_port
from searchr1.core.settings import RetrySettings
from searchr1.learner.process import run_learner
from searchr1.learner.settings import LearnerSettings
from searchr1.retriever.builder import build_index
from searchr1.retriever.loading import load_index
from searchr1.retriever.server import start_retriever
from searchr1.retriever.settings import RetrieverSettings
from searchr1.reward.app import build_service, create_app
from searchr1.reward.settings import RewardSettings
from searchr1.rollout.service import build_service as build_rollout
from searchr1.rollout.settings import RolloutSettings
from searchr1.weightsync import SnapshotError, WeightPublisher, fetch_snapshot, snapshot_digest, weights_app
from tests.support.synthetic import tiny_qwen2
from tests.support.tiny_lm import build_tokenizer

TOKEN = "s3cret-token"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
WRONG = [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}]


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("retriever")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{t} is a word.'}) + "\n"
                              for i, t in enumerate(["Moon", "Nile", "Chess"])))
    build_index(corpus, root / "bm25", "bm25")
    return root / "bm25"


async def assert_http_guarded(base_url: str, method: str, path: str, **kw) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for headers in WRONG:
            r = await http.request(method, path, headers=headers, **kw)
            assert r.status_code == 401, (path, headers, r.status_code)
            assert r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"
        r = await http.request(method, path, headers=GOOD, **kw)
        assert r.status_code == 200, (path, r.status_code, r.text)


async def test_retriever_grpc_http_and_closed_metrics(bm25_index):
    settings = RetrieverSettings(grpc_port=0, http_port=0, metrics_port=0, index=bm25_index, token=TOKEN,
                                 metrics_open=False)
    running = await start_retriever(settings, load_index(bm25_index, encoder_factory=None))
    try:
        request = retriever_pb2.SearchRequest(queries=["moon"], top_k=1)
        async with grpc.aio.insecure_channel(running.grpc_address) as channel:
            stub = retriever_pb2_grpc.RetrieverStub(channel)
            for metadata in [(), (("authorization", "Bearer nope"),), (("authorization", TOKEN),)]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Search(request, metadata=metadata, timeout=30)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and err.value.details()
            # malformed bytes without the token: still UNAUTHENTICATED, never parsed
            raw = channel.unary_unary("/searchr1.retriever.v1.Retriever/Search")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await raw(b"\xff\xff", timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = await stub.Search(request, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=30)
            assert ok.results[0].hits[0].doc_id == "0"
        async with RetrieverClient([running.grpc_address], retry=RetrySettings(retries=2)) as client:
            with pytest.raises(RetrieverError, match="UNAUTHENTICATED") as err:
                await client.search(["moon"], 3)
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        url = running.http.url
        await assert_http_guarded(url, "POST", "/retrieve", json={"queries": ["moon"], "topk": 1})
        await assert_http_guarded(url, "GET", "/metrics")
        await assert_http_guarded(f"http://127.0.0.1:{running.metrics_server.port}", "GET", "/metrics")
        await assert_http_guarded(url, "GET", "/openapi.json")
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            assert (await http.get("/healthz")).status_code == 200
    finally:
        await running.stop()


async def test_retriever_metrics_open_by_default_with_a_token(bm25_index):
    settings = RetrieverSettings(grpc_port=0, http_port=0, metrics_port=0, index=bm25_index, token=TOKEN)
    running = await start_retriever(settings, load_index(bm25_index, encoder_factory=None))
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.get(f"http://127.0.0.1:{running.metrics_server.port}/metrics")
            assert r.status_code == 200 and "searchr1_retriever" in r.text
        async with httpx.AsyncClient(base_url=running.http.url, timeout=30) as http:
            assert (await http.get("/metrics")).status_code == 200
            assert (await http.post("/retrieve", json={"queries": ["moon"]})).status_code == 401
    finally:
        await running.stop()


async def test_reward_endpoints_and_closed_metrics():
    server = HttpServer(create_app(build_service(RewardSettings(port=0, token=TOKEN, metrics_open=False))))
    await server.start()
    try:
        body = {"scorer": "exact_match", "items": [{"prompt": "q", "response": "<answer>a</answer>",
                                                    "golden_answers": ["a"]}]}
        await assert_http_guarded(server.url, "POST", "/v1/score", json=body)
        await assert_http_guarded(server.url, "GET", "/v1/scorers")
        await assert_http_guarded(server.url, "GET", "/metrics")
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            assert (await http.get("/healthz")).status_code == 200
        async with RewardClient(server.url, retry=RetrySettings(retries=2)) as client:
            with pytest.raises(RewardError, match="401") as err:
                await client.score("exact_match", body["items"])
            assert err.value.status_code == 401
        async with RewardClient(server.url, token=TOKEN) as client:
            assert len((await client.score("exact_match", body["items"])).scores) == 1
    finally:
        await server.stop()


def tiny_model():
    from searchr1.world.model import random_model
    from searchr1.world.settings import ModelSettings

    settings = ModelSettings(hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=64,
                             max_position=256)
    return random_model(settings, 64, pad_token_id=0, eos_token_id=1)


async def test_learner_weight_server_needs_the_token(tmp_path):
    publisher = WeightPublisher(tmp_path / "weights", keep=3)
    model = tiny_model()
    snap = publisher.write(3, model, model.state_dict())
    server = HttpServer(weights_app(publisher, token=TOKEN))
    await server.start()
    try:
        await assert_http_guarded(server.url, "GET", "/weights/3/files")
        await assert_http_guarded(server.url, "GET", "/weights/3/files/config.json")
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            assert (await http.get("/healthz")).status_code == 200
        announced = WeightVersion(version=3, uri=f"{server.url}/weights/3", sha256=snapshot_digest(snap))
        with pytest.raises(SnapshotError):
            await fetch_snapshot(announced, tmp_path / "no-token")
        got = await fetch_snapshot(announced, tmp_path / "dl", token=TOKEN)
        assert snapshot_digest(got) == announced.sha256
    finally:
        await server.stop()


async def assert_probes_open(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False) as http:
        for path in ("/healthz", "/readyz"):
            r = await http.get(path)
            assert r.status_code == 200, (path, r.status_code)


class IdleEngine:
    async def close(self) -> None:
        pass


async def test_rollout_worker_metrics_closed_with_its_token(redis_server, tmp_path):
    settings = RolloutSettings(worker_id="w", metrics_port=0, token=TOKEN, metrics_open=False,
                               redis={"url": redis_server.url, "run": "auth-rollout"},
                               weights={"download_dir": str(tmp_path / "dl")})
    service = await build_rollout(settings, generator=IdleEngine(), tokenizer=build_tokenizer())
    try:
        base = service.metrics_url.removesuffix("/metrics")
        await assert_http_guarded(base, "GET", "/metrics")
        await assert_probes_open(base)
    finally:
        await service.close()


async def test_learner_metrics_closed_with_its_token(redis_server, tmp_path):
    port = free_port()
    settings = LearnerSettings(
        redis={"url": redis_server.url, "run": "auth-learner"}, device="cpu",
        model={"path": str(tiny_qwen2(tmp_path / "model", vocab=256, hidden=32))},
        dispatcher={"enabled": False}, weights={"dir": str(tmp_path / "weights")},
        checkpoint={"dir": str(tmp_path / "ckpt")}, log_dir=str(tmp_path / "logs"), read_block_ms=100,
        metrics_port=port, token=TOKEN, metrics_open=False)
    stop = asyncio.Event()
    learning = asyncio.create_task(run_learner(settings, stop))
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5, trust_env=False) as http:
            for _ in range(600):
                assert not learning.done(), learning.exception()
                try:
                    if (await http.get("/readyz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        await assert_http_guarded(base, "GET", "/metrics")
        await assert_probes_open(base)
    finally:
        stop.set()
        await asyncio.wait_for(learning, 60)


def test_closed_metrics_need_a_token():
    with pytest.raises(ValueError, match="needs a token"):
        RolloutSettings(metrics_open=False)
    with pytest.raises(ValueError, match="needs a token"):
        LearnerSettings(metrics_open=False)
    assert RolloutSettings(token=TOKEN).metrics_open, "metrics stay open by default"
