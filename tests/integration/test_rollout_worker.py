"""A rollout worker end to end on real components: vLLM (CPU build) on a tiny random Qwen2 the test
builds, a real BM25 retriever over gRPC, the real reward service over HTTP, and a real Redis.

Tasks in → scored groups out (each a valid `TrajectoryGroup`, exact masks, tasks acked); a task left
unacked by a "dead" consumer is reclaimed and redone; after a weight push (a perturbed snapshot written
with `save_pretrained`, announced with its sha256) the worker reloads in place and generates with the new
weights (outputs change, version tag changes); stopping drains in-flight tasks (published and acked).

The random model is steered into the Search-R1 turn structure by the `SearchSteering` logits processor
so it actually searches. One engine serves the whole module (engine start is slow), on a session loop.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import pytest_asyncio

from searchr1.core.schemas import SamplingParams, Task, TrajectoryGroup, WeightVersion
from searchr1.rollout.service import build_service
from searchr1.rollout.settings import RolloutSettings
from searchr1.rollout.tools.steering import steer_args, word_tokens
from searchr1.streams import StreamKeys, TypedStream, connect, tasks_stream, trajectories_stream
from searchr1.weightsync import announce, snapshot_digest
from tests.support.rollout_stack import QUESTIONS, start_retriever, start_reward, start_vllm
from tests.support.tiny_lm import build_tiny_lm, perturb_weights

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny") / "v0")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(model_dir, tmp_path_factory):
    gen = await start_vllm(model_dir)
    retriever = await start_retriever(tmp_path_factory.mktemp("retriever"))
    reward = await start_reward()
    yield gen, retriever, reward
    await reward.stop()
    await retriever.stop()
    await gen.close()


def _settings(redis_url: str, retriever, reward, model_dir, tokenizer, **tasks) -> RolloutSettings:
    return RolloutSettings(
        model=str(model_dir), worker_id="w1", metrics_port=0,
        redis={"url": redis_url, "run": "itest"},
        agent={"max_turns": 3, "max_tokens_per_turn": 64, "max_obs_tokens": 120, "max_response_tokens": 1024,
               "extra_args": steer_args(tokenizer, p_search=0.8, max_searches=3,
                                                 search_tokens=word_tokens(tokenizer))},
        retriever={"addresses": [retriever.address], "top_k": 2, "max_wait_ms": 2},
        reward={"url": reward.url, "scorer": "searchr1_em"},
        tasks={"max_concurrent": 4, "block_ms": 100, "visibility_timeout_ms": 3000, "reclaim_interval_s": 0.3,
               "drain_timeout_s": None, **tasks},
        weights={"poll_interval_s": 0.2},
    )


def _task(i: int, seed: int, suffix: str = "") -> Task:
    q, golds = QUESTIONS[i % len(QUESTIONS)]
    return Task(task_id=f"t{i}{suffix}", question=q, golden_answers=golds, group_size=3,
                sampling=SamplingParams(seed=seed))


async def _collect(stream: TypedStream, n: int, timeout: float = 240.0) -> list[TrajectoryGroup]:
    out: list[TrajectoryGroup] = []
    end = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < end, f"only {len(out)} of {n} groups arrived"
        for e in await stream.read("learner-test", count=n - len(out), block_ms=200):
            out.append(e.value)
            await stream.ack(e.id)
    return out


def _check_group(group: TrajectoryGroup, tokenizer, version: int) -> None:
    assert group.policy_version == version and group.worker_id == "w1"
    assert len(group.trajectories) == group.task.group_size
    for t in group.trajectories:
        assert t.finish_reason != "error"
        assert len(t.response_ids) == len(t.loss_mask) == len(t.behavior_logprobs)
        sampled = [i for i, m in zip(t.response_ids, t.loss_mask) if m]
        policy_lps = [lp for lp, m in zip(t.behavior_logprobs, t.loss_mask) if m]
        # steering forces the tags (log-prob exactly 0 under the processed distribution); free tokens are < 0
        assert sampled and all(lp <= 0 for lp in policy_lps) and any(lp < 0 for lp in policy_lps)
        # environment tokens are exactly the observations: every masked-out run decodes to one
        runs, cur = [], []
        for i, m in zip(t.response_ids, t.loss_mask):
            if m == 0:
                cur.append(i)
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        assert len(runs) == t.num_searches
        for r in runs:
            text = tokenizer.decode(r, skip_special_tokens=False)
            assert text.startswith("\n\n<information>") and text.endswith("</information>\n\n")
        assert t.response_text == tokenizer.decode(t.response_ids, skip_special_tokens=False)
        assert 0.0 <= t.reward <= 1.0


async def test_worker_tasks_in_groups_out_reclaim_weight_push_and_drain(stack, redis_server, model_dir, tmp_path):
    gen, retriever, reward = stack
    tokenizer = gen.tokenizer()
    redis = connect(redis_server.url)
    await redis.flushdb()
    keys = StreamKeys("itest")
    settings = _settings(redis_server.url, retriever, reward, model_dir, tokenizer)
    service = await build_service(settings, generator=gen, tokenizer=tokenizer)
    tasks = tasks_stream(redis, keys)
    groups = trajectories_stream(redis, keys)
    await tasks.ensure_group()
    await groups.ensure_group()

    # a task delivered to a consumer that dies before acking: the worker must reclaim and redo it
    await tasks.publish(_task(5, seed=50, suffix="-orphan"))
    assert len(await tasks.read("ghost", count=1)) == 1
    for i in range(3):
        await tasks.publish(_task(i, seed=100 + i))

    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    try:
        first = await _collect(groups, 4)
        by_id = {g.task.task_id: g for g in first}
        assert set(by_id) == {"t0", "t1", "t2", "t5-orphan"}
        for g in first:
            _check_group(g, tokenizer, version=0)
        all_t = [t for g in first for t in g.trajectories]
        assert sum(t.num_searches for t in all_t) > 0, "steered policy never searched"
        assert {t.finish_reason for t in all_t} <= {"answer", "max_turns", "length", "eos"}
        assert await tasks.pending() == 0

        # metrics endpoint answers with our counters
        async with httpx.AsyncClient() as client:
            body = (await client.get(service.metrics_url)).text
        assert "searchr1_rollout_groups_total 4.0" in body
        assert "searchr1_rollout_search_latency_seconds_count" in body

        # weight push: a perturbed snapshot, announced; the same task (same seed) must now differ
        snap = perturb_weights(model_dir, tmp_path / "v1", scale=0.3)
        await announce(redis, keys, WeightVersion(version=1, uri=str(snap), sha256=snapshot_digest(snap)))
        for _ in range(500):  # the worker polls between tasks; wait until it has reloaded
            if service.worker.loader.version == 1:
                break
            await asyncio.sleep(0.02)
        assert service.worker.loader.version == 1
        assert service.metrics.weight_reload_seconds._sum.get() > 0
        await tasks.publish(_task(0, seed=100, suffix="-v1"))
        (after,) = await _collect(groups, 1)
        _check_group(after, tokenizer, version=1)
        assert service.worker.loader.version == 1
        before_ids = [t.response_ids for t in by_id["t0"].trajectories]
        after_ids = [t.response_ids for t in after.trajectories]
        assert before_ids != after_ids

        # drain: tasks in flight when stop is set are finished, published and acked
        for i in range(2):
            await tasks.publish(_task(i + 1, seed=300 + i, suffix="-drain"))
        for _ in range(500):
            if await tasks.pending() == 2:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(run, 240)
        drained = await _collect(groups, 2, timeout=10)
        assert {g.task.task_id for g in drained} == {"t1-drain", "t2-drain"}
        assert await tasks.pending() == 0
    finally:
        stop.set()
        if not run.done():
            run.cancel()
        await service.close()
        await redis.aclose()
