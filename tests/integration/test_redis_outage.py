"""A learner (`run_learner`: dispatcher, training on a tiny Qwen2, checkpoints, archive, weight
announcements) and a rollout worker (`build_service`: its Redis wiring, weight loader and metrics port,
with a scripted engine and the real reward service) ride through 10 s without Redis: a real
redis-server with an append-only file is stopped mid-run and restarted on the same port. Both report
not-ready (`/readyz` 503) while Redis is away and ready again after; the run finishes its dataset and
every task is published once and trained exactly once, with nothing left pending and nothing
dead-lettered."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx
import torch

from searchr1.core.redis_server import RedisServer
from searchr1.core.servers import free_port
from searchr1.learner.process import run_learner
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.tools import archive
from searchr1.rollout.service import build_service
from searchr1.rollout.settings import RolloutSettings
from searchr1.streams import StreamKeys, connect, read_dead, tasks_stream, trajectories_stream
from tests.load.scripted_engine import ScriptedEngine
from tests.support.rollout_stack import start_reward
from tests.support.tiny_lm import build_tiny_lm, build_tokenizer

torch.set_num_threads(1)

TASKS = 16
OUTAGE_S = 10.0


async def _get(client: httpx.AsyncClient, url: str) -> httpx.Response | None:
    try:
        return await client.get(url)
    except httpx.HTTPError:
        return None


async def _until(what: str, check, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.1)


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def test_learner_and_worker_ride_through_10s_without_redis(tmp_path):
    model_dir = build_tiny_lm(tmp_path / "model")
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"q{i}", "question": f"question {i}?", "golden_answers": ["a"]})
                               + "\n" for i in range(TASKS)))
    server = RedisServer(workdir=tmp_path / "redis", appendonly=True).start()
    reward = await start_reward()
    lport = free_port()
    learner_settings = LearnerSettings(
        redis={"url": server.url, "run": "outage"}, model={"path": str(model_dir)},
        optim={"lr": 1e-3, "total_steps": 100}, batch={"groups_per_step": 2, "micro_batch_size": 4,
                                                       "max_seq_len": 256},
        dispatcher={"dataset": str(dataset), "group_size": 2, "epochs": 1, "max_inflight": 4, "poll_s": 0.1},
        weights={"dir": str(tmp_path / "weights"), "keep": 2}, checkpoint={"dir": str(tmp_path / "ckpt")},
        log_dir=str(tmp_path / "logs"), device="cpu", read_block_ms=200, metrics_port=lport,
    )
    tokenizer = build_tokenizer()
    worker_settings = RolloutSettings(
        model=str(model_dir), worker_id="w1", metrics_port=0, redis={"url": server.url, "run": "outage"},
        retriever={"addresses": ["127.0.0.1:1"]}, reward={"url": reward.url, "scorer": "searchr1_em"},
        tasks={"max_concurrent": 2, "block_ms": 100},
        weights={"download_dir": str(tmp_path / "dl"), "poll_interval_s": 0.2},
    )
    service = await build_service(worker_settings, generator=ScriptedEngine(tokenizer, delay_s=0.2), tokenizer=tokenizer)
    learner_stop, worker_stop = asyncio.Event(), asyncio.Event()
    learning = asyncio.create_task(run_learner(learner_settings, learner_stop))
    working = asyncio.create_task(service.run(worker_stop))
    ready = {"learner": f"http://127.0.0.1:{lport}/readyz",
             "worker": service.metrics_url.removesuffix("/metrics") + "/readyz"}
    metrics = {"learner": f"http://127.0.0.1:{lport}/metrics", "worker": service.metrics_url}
    seen_503: set[str] = set()
    try:
        async with httpx.AsyncClient(timeout=3, trust_env=False) as client:

            async def status(name: str) -> int | None:
                r = await _get(client, ready[name])
                return None if r is None else r.status_code

            async def steps() -> float:
                r = await _get(client, metrics["learner"])
                return 0.0 if r is None else _sample(r.text, "searchr1_learner_steps_total")

            async def all_ready() -> bool:
                return [await status(n) for n in ready] == [200, 200]

            await _until("both ready", all_ready, 120)
            await _until("two learner steps", lambda: _steps_at_least(steps, 2), 120)
            assert not learning.done(), "the run must still be going when Redis goes away"

            await asyncio.to_thread(server.stop)
            t_down = time.monotonic()

            async def both_not_ready() -> bool:
                for n in ready:
                    if await status(n) == 503:
                        seen_503.add(n)
                return seen_503 == set(ready)

            await _until("both not ready while Redis is away", both_not_ready, 5)
            await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - t_down)))
            assert not learning.done() and not working.done(), "no service gave up on Redis"
            await asyncio.to_thread(server.start)
            await _until("both ready again", all_ready, 20)
            texts = {n: (await client.get(u)).text for n, u in metrics.items()}
            assert _sample(texts["learner"], "searchr1_learner_redis_reconnects_total") >= 1
            assert _sample(texts["worker"], "searchr1_rollout_redis_reconnects_total") >= 1
            assert _sample(texts["worker"], "searchr1_rollout_redis_retries_total") >= 1

            state = await asyncio.wait_for(learning, 180)  # the dataset's single epoch, to the end
            published = _sample((await client.get(metrics["worker"])).text, "searchr1_rollout_groups_total")
        worker_stop.set()
        await asyncio.wait_for(working, 30)
    finally:
        learner_stop.set()
        worker_stop.set()
        for t in (learning, working):
            if not t.done():
                t.cancel()
        await asyncio.gather(learning, working, return_exceptions=True)
        await service.close()
        await reward.stop()

    try:
        assert state.step == TASKS // 2
        table = archive.read(learner_settings.archive_dir, columns=["step", "task_id", "index"])
        trained = Counter(t for t, i in zip(table.column("task_id").to_pylist(), table.column("index").to_pylist())
                          if i == 0)
        assert sorted(trained) == sorted(f"q{i}@e0" for i in range(TASKS)), "every task trained"
        assert set(trained.values()) == {1}, f"a task trained twice: {trained}"
        assert published == TASKS, "every task published once"
        redis = connect(server.url)
        try:
            keys = StreamKeys("outage")
            assert await tasks_stream(redis, keys).pending() == 0
            assert await trajectories_stream(redis, keys).pending() == 0
            assert await read_dead(redis, keys.dead) == []
        finally:
            await redis.aclose()
    finally:
        server.stop()


async def _steps_at_least(steps, n: int) -> bool:
    return await steps() >= n

