"""A rollout worker on real components (vLLM CPU on the tiny model, steered to search; a BM25 retriever
over gRPC; the reward service over HTTP; Redis) while its dependencies go down and come back on the same
port:

- the retriever down for 10 s, within the search's retry deadline: the searches retry with backoff and
  succeed once it is back; the group is normal; retries are counted;
- the retriever down past the deadline: the trajectories end with `retriever_unavailable`, the group is
  still published, failures are counted, and the worker carries on once the retriever is back;
- the reward service down for 10 s, past its deadline: the task stays unacked (counted), is redelivered
  after the visibility timeout and published once the service is back.

The worker task never dies. One engine serves the whole module (engine start is slow)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import pytest_asyncio

from searchr1.core.schemas import SamplingParams, Task, TrajectoryGroup
from searchr1.core.servers import HttpServer, free_port
from searchr1.rollout.service import build_service
from searchr1.rollout.settings import RolloutSettings
from searchr1.rollout.tools.steering import steer_args, word_tokens
from searchr1.streams import StreamKeys, TypedStream, connect
from tests.support.rollout_stack import QUESTIONS, start_vllm, write_corpus
from tests.support.tiny_lm import build_tiny_lm

pytestmark = pytest.mark.asyncio(loop_scope="module")
OUTAGE_S = 10.0


class Restartable:
    """A retriever or reward server that can be stopped and started again on the same port."""

    def __init__(self, kind: str, index_dir: Path | None = None) -> None:
        self.kind, self.index_dir, self.port = kind, index_dir, free_port()
        self.handle = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}" if self.kind == "retriever" else f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        if self.kind == "retriever":
            from searchr1.retriever.server import open_index, start_retriever
            from searchr1.retriever.settings import RetrieverSettings

            settings = RetrieverSettings(index=self.index_dir, grpc_port=self.port, http_port=None,
                                         shutdown_grace_s=0.0)
            self.handle = await start_retriever(settings, await asyncio.to_thread(open_index, settings))
        else:
            from searchr1.reward.app import build_service as build_reward
            from searchr1.reward.app import create_app
            from searchr1.reward.settings import RewardSettings

            self.handle = HttpServer(create_app(build_reward(RewardSettings(port=0))), port=self.port)
            await self.handle.start()

    async def stop(self) -> None:
        if self.handle is not None:
            await self.handle.stop()
            self.handle = None

    async def restart_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.start()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny") / "v0")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(model_dir, tmp_path_factory):
    from searchr1.retriever.builder import build_index

    root = tmp_path_factory.mktemp("retriever")
    await asyncio.to_thread(build_index, write_corpus(root / "corpus.jsonl"), root / "index", "bm25")
    gen = await start_vllm(model_dir, max_num_seqs=16)
    retriever, reward = Restartable("retriever", root / "index"), Restartable("reward")
    await retriever.start()
    await reward.start()
    yield gen, retriever, reward
    await reward.stop()
    await retriever.stop()
    await gen.close()


async def start_worker(stack, redis_url: str, model_dir, run: str, *, retriever_deadline_s: float,
                       reward_deadline_s: float = 30.0):
    gen, retriever, reward = stack
    tokenizer = gen.tokenizer()
    settings = RolloutSettings(
        model=str(model_dir), worker_id="w1", metrics_port=0, redis={"url": redis_url, "run": run},
        agent={"max_turns": 2, "max_tokens_per_turn": 48, "max_obs_tokens": 100, "max_response_tokens": 512,
               "extra_args": steer_args(tokenizer, p_search=1.0, max_searches=2,
                                        search_tokens=word_tokens(tokenizer))},
        retriever={"addresses": [retriever.address], "top_k": 2, "max_wait_ms": 2, "timeout_s": 2.0,
                   "retries": 1000, "backoff_s": 0.1, "max_backoff_s": 0.5, "deadline_s": retriever_deadline_s},
        reward={"url": reward.address, "scorer": "searchr1_em", "timeout_s": 2.0, "retries": 1000,
                "backoff_s": 0.1, "max_backoff_s": 0.5, "deadline_s": reward_deadline_s},
        tasks={"max_concurrent": 2, "block_ms": 100, "visibility_timeout_ms": 3000, "reclaim_interval_s": 0.3,
               "max_deliveries": 50},
        weights={"poll_interval_s": 1.0},
    )
    service = await build_service(settings, generator=gen, tokenizer=tokenizer)
    redis = connect(redis_url)
    keys = StreamKeys(run)
    tasks = TypedStream(redis, keys.tasks, Task, "rollout", dead_key=keys.dead)
    groups = TypedStream(redis, keys.trajectories, TrajectoryGroup, "learner", dead_key=keys.dead)
    await tasks.ensure_group()
    await groups.ensure_group()
    stop = asyncio.Event()
    running = asyncio.create_task(service.run(stop))
    return service, redis, tasks, groups, stop, running


async def stop_worker(service, redis, stop, running) -> None:
    stop.set()
    try:
        await asyncio.wait_for(running, 120)
    finally:
        await service.close()
        await redis.aclose()


def task(i: int, suffix: str) -> Task:
    q, golds = QUESTIONS[i % len(QUESTIONS)]
    return Task(task_id=f"t{i}-{suffix}", question=q, golden_answers=golds, group_size=2,
                sampling=SamplingParams(seed=10 + i))


async def collect(groups: TypedStream, n: int, running: asyncio.Task, timeout: float = 180.0):
    out: list[TrajectoryGroup] = []
    end = time.monotonic() + timeout
    while len(out) < n:
        assert not running.done(), f"the worker stopped: {running.exception() if running.done() else ''}"
        assert time.monotonic() < end, f"only {len(out)} of {n} groups arrived"
        for e in await groups.read("learner-test", count=n - len(out), block_ms=200):
            out.append(e.value)
            await groups.ack(e.id)
    return out


def counter(metric, *labels) -> float:
    return metric.labels(*labels)._value.get()


async def test_retriever_down_for_10s_within_the_deadline_rides_through(stack, redis_server, model_dir):
    _, retriever, _ = stack
    service, redis, tasks, groups, stop, running = await start_worker(
        stack, redis_server.url, model_dir, "ride", retriever_deadline_s=OUTAGE_S + 20)
    try:
        await retriever.stop()

        async def back_after_the_first_failed_search() -> float:
            # the outage is timed from the first search that found the retriever down (on loaded cores the
            # first turn can take longer than the whole outage, and a search after it would not wait)
            while counter(service.metrics.dependency_retries, "retriever") < 1:
                await asyncio.sleep(0.05)
            t0 = time.monotonic()
            await retriever.restart_after(OUTAGE_S)
            return t0

        back = asyncio.create_task(back_after_the_first_failed_search())
        await tasks.publish(task(0, "ride"))
        (group,) = await collect(groups, 1, running)
        t0 = await back
        assert time.monotonic() - t0 >= OUTAGE_S * 0.9  # the search really waited for the retriever
        trajectories = group.trajectories
        assert sum(t.num_searches for t in trajectories) > 0
        assert {t.finish_reason for t in trajectories} <= {"answer", "max_turns", "length", "eos"}
        assert counter(service.metrics.dependency_retries, "retriever") >= 3
        assert counter(service.metrics.dependency_failures, "retriever") == 0
        assert await tasks.pending() == 0
    finally:
        if retriever.handle is None:
            await retriever.start()
        await stop_worker(service, redis, stop, running)


async def test_retriever_down_past_the_deadline_ends_trajectories_clearly(stack, redis_server, model_dir):
    _, retriever, _ = stack
    service, redis, tasks, groups, stop, running = await start_worker(
        stack, redis_server.url, model_dir, "give-up", retriever_deadline_s=1.5)
    try:
        await retriever.stop()
        await tasks.publish(task(1, "down"))
        (group,) = await collect(groups, 1, running)
        reasons = {t.finish_reason for t in group.trajectories}
        assert reasons == {"retriever_unavailable"}, reasons
        assert all(t.num_searches == 0 and t.response_ids for t in group.trajectories)
        m = service.metrics
        assert counter(m.dependency_failures, "retriever") >= 1
        assert counter(m.dependency_retries, "retriever") >= 1
        assert counter(m.trajectories, "retriever_unavailable") == 2
        assert await tasks.pending() == 0  # published and acked: the learner decides what to do with it

        await retriever.start()  # back on the same port: the same worker searches again
        await tasks.publish(task(2, "back"))
        (after,) = await collect(groups, 1, running)
        assert sum(t.num_searches for t in after.trajectories) > 0
        assert "retriever_unavailable" not in {t.finish_reason for t in after.trajectories}
    finally:
        if retriever.handle is None:
            await retriever.start()
        await stop_worker(service, redis, stop, running)


async def test_reward_down_for_10s_task_redelivered_and_published(stack, redis_server, model_dir):
    _, _, reward = stack
    service, redis, tasks, groups, stop, running = await start_worker(
        stack, redis_server.url, model_dir, "reward", retriever_deadline_s=10.0, reward_deadline_s=1.5)
    try:
        await reward.stop()
        back = asyncio.create_task(reward.restart_after(OUTAGE_S))
        await tasks.publish(task(3, "reward"))
        (group,) = await collect(groups, 1, running, timeout=OUTAGE_S + 120)
        await back
        assert group.task.task_id == "t3-reward"
        m = service.metrics
        assert counter(m.dependency_failures, "reward") >= 1
        assert counter(m.dependency_retries, "reward") >= 1
        assert sum(counter(m.task_failures, stage) for stage in ("rollout", "publish", "ack")) >= 1
        assert await tasks.pending() == 0
        assert await redis.xlen(StreamKeys("reward").dead) == 0  # redelivered, never buried
    finally:
        if reward.handle is None:
            await reward.start()
        await stop_worker(service, redis, stop, running)
