"""How the agent and the clients report an unreachable dependency, without servers: a search whose
retries ran out ends the trajectory with `retriever_unavailable` (a spent web search budget with
`search_budget`, a refused one with `error`), and the clients call `on_retry` before each retry and
`on_give_up` once, with bounded attempts, against a port nothing listens on."""

from __future__ import annotations

import time

import grpc
import pytest

from searchr1.core.clients.retriever import RetrieverClient, RetrieverError
from searchr1.core.clients.reward import RewardClient, RewardError
from searchr1.core.servers import free_port
from searchr1.core.settings import RetrySettings
from searchr1.rollout.agent import AgentLimits, run_trajectory
from searchr1.rollout.engine import TurnOutput, TurnRequest
from searchr1.rollout.settings import AgentSettings


class CharCodec:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids)


class SearchingGenerator:
    """Every turn searches (ids count up from 70 000, so they are not the codec's)."""

    def __init__(self) -> None:
        self.next_id = 70_000

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        ids = list(range(self.next_id, self.next_id + 5))
        self.next_id += 5
        return TurnOutput(ids, [-0.1] * 5, "<search> capital of france </search>", "stop", "</search>")


def failing_search(code: grpc.StatusCode):
    async def search(query: str):
        raise RetrieverError(f"search failed: {code.name}", code)

    return search


@pytest.mark.parametrize("code, reason", [
    (grpc.StatusCode.UNAVAILABLE, "retriever_unavailable"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "retriever_unavailable"),
    (grpc.StatusCode.FAILED_PRECONDITION, "search_budget"),
    (grpc.StatusCode.INVALID_ARGUMENT, "error"),
    (grpc.StatusCode.UNAUTHENTICATED, "error"),
])
async def test_agent_names_why_the_search_failed(code, reason):
    res = await run_trajectory([1, 2], SearchingGenerator(), CharCodec(), failing_search(code), AgentLimits.from_settings(AgentSettings()))
    assert res.finish_reason == reason and code.name in (res.error or "")
    assert res.num_turns == 1 and res.response_ids == list(range(70_000, 70_005))  # what was sampled is kept


async def test_retriever_client_counts_retries_and_gives_up_within_its_deadline():
    retries, give_ups = [], []
    client = RetrieverClient([f"127.0.0.1:{free_port()}"], on_retry=retries.append,
                             on_give_up=give_ups.append, retry=RetrySettings(timeout_s=1.0, retries=1000, backoff_s=0.05, max_backoff_s=0.2, deadline_s=1.0))
    t0 = time.monotonic()
    try:
        with pytest.raises(RetrieverError) as err:
            await client.search(["moon"], 3)
    finally:
        await client.close()
    assert time.monotonic() - t0 < 3.0
    assert err.value.unavailable and err.value.code == grpc.StatusCode.UNAVAILABLE
    assert "retriever unavailable" in str(err.value)
    assert len(retries) >= 2 and all(isinstance(e, grpc.aio.AioRpcError) for e in retries)
    assert len(give_ups) == 1 and "UNAVAILABLE" in give_ups[0]


async def test_reward_client_counts_retries_and_gives_up_within_its_deadline():
    retries, give_ups = [], []
    async with RewardClient(f"http://127.0.0.1:{free_port()}", on_retry=retries.append,
                            on_give_up=give_ups.append, retry=RetrySettings(timeout_s=1.0, retries=1000, backoff_s=0.05, max_backoff_s=0.2, deadline_s=1.0)) as client:
        t0 = time.monotonic()
        with pytest.raises(RewardError, match="failed after"):
            await client.score("exact_match", [{"prompt": "q", "response": "a", "golden_answers": ["a"]}])
    assert time.monotonic() - t0 < 3.0
    assert len(retries) >= 2 and len(give_ups) == 1


def test_bad_retry_settings_refused():
    with pytest.raises(ValueError, match="deadline_s"):
        RetrieverClient(["127.0.0.1:1"], retry=RetrySettings(deadline_s=0))
    with pytest.raises(ValueError, match="max_backoff_s"):
        RewardClient("http://127.0.0.1:1", retry=RetrySettings(max_backoff_s=0))
