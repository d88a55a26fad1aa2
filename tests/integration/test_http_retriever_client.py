"""The `/retrieve` client against a stand-in of Search-R1's own `retrieval_server.py` (a FastAPI app answering
its JSON exactly: `{"result": [[{"document": {"id", "contents"}, "score"}]]}`, or bare documents without
`return_scores`) on loopback: hits with titles, retries through a 503, the failure statuses read as the gRPC
client's (so the agent's finish reasons and the eval preflight treat both alike), and a rollout setting of an
http URL picks this client."""

from __future__ import annotations

import grpc
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchr1.core.clients.http_retriever import HttpRetrieverClient, parse_retrieve_answer, retriever_client
from searchr1.core.clients.retriever import RetrieverClient, RetrieverError
from searchr1.core.servers import HttpServer
from searchr1.core.settings import RetrySettings

CORPUS = [{"id": "0", "contents": '"Paris"\nParis is the capital of France.'},
          {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'}]


def searchr1_server(state: dict) -> FastAPI:
    """Search-R1's retrieval_server.py's /retrieve, with scripted failures."""
    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve(request: Request):
        state["calls"] = state.get("calls", 0) + 1
        if state.get("fail"):
            status = state["fail"].pop(0)
            return JSONResponse({"detail": "scripted"}, status_code=status)
        body = await request.json()
        state["bodies"] = [*state.get("bodies", []), body]
        results = [CORPUS[: body["topk"]] for _ in body["queries"]]
        if body.get("return_scores"):
            return {"result": [[{"document": d, "score": 1.0 - i / 10} for i, d in enumerate(r)] for r in results]}
        return {"result": results}

    return app


@pytest.fixture
async def server():
    state: dict = {}
    http = HttpServer(searchr1_server(state))
    await http.start()
    yield http.url, state
    await http.stop()


async def test_search_reads_search_r1_answers_and_retries_a_503(server):
    url, state = server
    client = HttpRetrieverClient(url, retry=RetrySettings(retries=2, backoff_s=0.01))
    try:
        hits = await client.search(["capital of france", "q2"], 2)
        assert state["bodies"][-1] == {"queries": ["capital of france", "q2"], "topk": 2, "return_scores": True}
        assert [[h.title for h in row] for row in hits] == [["Paris", "Berlin"]] * 2
        assert hits[0][0].contents == CORPUS[0]["contents"] and hits[0][0].score == 1.0 and hits[0][1].doc_id == "1"
        state["fail"] = [503]
        assert len(await client.search(["q"], 1)) == 1  # retried
        for status, code in ((401, grpc.StatusCode.UNAUTHENTICATED), (402, grpc.StatusCode.FAILED_PRECONDITION),
                             (422, grpc.StatusCode.INVALID_ARGUMENT)):
            state["fail"] = [status]
            with pytest.raises(RetrieverError) as e:
                await client.search(["q"], 1)
            assert e.value.code == code and not e.value.unavailable
        state["fail"] = [503, 503, 503]
        with pytest.raises(RetrieverError) as e:
            await client.search(["q"], 1)
        assert e.value.unavailable and "after 3 attempts" in str(e.value)
        assert await client.info() == {}  # a Search-R1 server has no /healthz
    finally:
        await client.close()


def test_answers_without_scores_and_malformed_ones():
    hits = parse_retrieve_answer({"result": [CORPUS]}, 1)
    assert [h.title for h in hits[0]] == ["Paris", "Berlin"] and hits[0][1].score == -1.0
    for bad in ({}, {"result": [[{"document": {"id": "x"}}]]}, {"result": [[], []]}, {"result": ["x"]}):
        with pytest.raises(ValueError):
            parse_retrieve_answer(bad, 1)


def test_the_address_picks_the_client():
    assert isinstance(retriever_client(["http://127.0.0.1:8000"]), HttpRetrieverClient)
    assert isinstance(retriever_client(["127.0.0.1:50051"]), RetrieverClient)
    with pytest.raises(ValueError, match="mix"):
        retriever_client(["http://a:1", "b:2"])
