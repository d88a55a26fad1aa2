"""A rollout worker completing trajectories against a web search backend: the real worker loop over
real Redis streams, the real retriever client and search batcher calling the retriever service (gRPC)
over `WebBackend`, which asks the local fake search API; the real reward service scores the groups.
The engine is scripted (no vLLM): its first turn searches the task's question, its second answers with
the title of the first passage it was shown, so a right answer proves the web passages reached the
model's context.

With a budget of two billed queries, the first two tasks' groups are answered (each group's G identical
searches cost one request); the third task's trajectories end with finish reason `search_budget`, and
its group is still published.
"""

from __future__ import annotations

import asyncio
import re
import time

from searchr1.core.clients.retriever import RetrieverClient
from searchr1.core.clients.reward import RewardClient
from searchr1.core.schemas import Task
from searchr1.retriever.server import start_web_retriever
from searchr1.retriever.settings import RetrieverSettings
from searchr1.rollout.batcher import SearchBatcher
from searchr1.rollout.engine import TurnOutput, TurnRequest
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.rollout.sampler import GroupSampler
from searchr1.rollout.settings import (
    AgentSettings,
    RetrieverClientSettings,
    RewardClientSettings,
    TaskSettings,
)
from searchr1.rollout.worker import Worker
from searchr1.streams import StreamKeys, tasks_stream, trajectories_stream
from searchr1.weightsync import WeightLoader
from tests.support.fake_search_api import FakeSearchAPI
from tests.support.rollout_stack import CORPUS, start_reward


class Codec:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class SearchThenAnswer:
    """Turn 1: `<search> {question} </search>`; turn 2: `<answer> {title of Doc 1} </answer>`."""

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        context = Codec().decode(request.prompt_ids)
        shown = re.search(r'Doc 1\(Title: "?([^")]+)', context)
        if shown is None:
            question = re.search(r"Question: (.*?)\n", context).group(1)
            text = f"<think> I should search. </think><search> {question} </search>"
            return TurnOutput(Codec().encode(text), [-0.1] * len(text), text, "stop", "</search>")
        text = f"<think> found it </think><answer> {shown.group(1)} </answer>"
        return TurnOutput(Codec().encode(text), [-0.1] * len(text), text, "stop", "</answer>")

    async def reload(self, path, digest=None):
        pass

    async def close(self):
        pass


async def test_a_worker_completes_trajectories_on_web_search_until_the_budget_is_spent(redis, tmp_path):
    api = await FakeSearchAPI(CORPUS, key="k").start()
    settings = RetrieverSettings(backend="web", grpc_port=0, http_port=None, web={
        "provider": "brave", "base_url": api.url, "api_key": "k", "budget": {"max_queries": 2},
        "cache": {"kind": "sqlite", "path": str(tmp_path / "cache.sqlite")}})
    retriever = await start_web_retriever(settings)
    reward = await start_reward()
    client = RetrieverClient([retriever.grpc_address])
    keys = StreamKeys("web")
    metrics = RolloutMetrics()
    tasks = tasks_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    groups = trajectories_stream(redis, keys)
    await tasks.ensure_group()
    await groups.ensure_group()
    search = SearchBatcher(client, RetrieverClientSettings(top_k=2, max_wait_ms=2))
    sampler = GroupSampler(SearchThenAnswer(), Codec(), None, search.search, RewardClient(reward.url),
                           AgentSettings(), RewardClientSettings(url=reward.url, scorer="searchr1_em"), metrics)
    loader = WeightLoader(redis, keys, SearchThenAnswer(), tmp_path, **metrics.loader_callbacks())
    worker = Worker(sampler, tasks, groups, loader, metrics, "w", TaskSettings(block_ms=50))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        questions = [("what is the capital of france", "Paris"), ("who wrote pride and prejudice", "Jane Austen"),
                     ("when was the golden gate bridge opened", "1937")]
        got = {}
        for i, (q, gold) in enumerate(questions):  # one at a time: which task meets the spent budget is fixed
            await tasks.publish(Task(task_id=f"t{i}", question=q, golden_answers=[gold], group_size=3))
            end = time.monotonic() + 30
            while f"t{i}" not in got:
                assert time.monotonic() < end, f"task t{i} was never published"
                for e in await groups.read("t", count=1, block_ms=100):
                    got[e.value.task.task_id] = e.value
                    await groups.ack(e.id)
        first, second, third = got["t0"], got["t1"], got["t2"]
        assert [t.finish_reason for t in first.trajectories] == ["answer"] * 3 and first.rewards == [1.0] * 3
        assert "Paris is the capital" in first.trajectories[0].response_text
        assert [t.finish_reason for t in second.trajectories] == ["answer"] * 3 and second.rewards == [1.0] * 3
        assert [t.finish_reason for t in third.trajectories] == ["search_budget"] * 3
        assert all(t.num_searches == 0 for t in third.trajectories) and third.rewards == [0.0] * 3
        assert api.calls["brave"] == 2  # a group's three identical searches cost one request
        assert metrics.trajectories.labels("search_budget")._value.get() == 3
        assert await tasks.pending() == 0
    finally:
        stop.set()
        await asyncio.wait_for(run, 10)
        await client.close()
        await retriever.stop()
        await reward.stop()
        await api.stop()
