"""Backpressure under a stalled learner: the learner's dispatcher feeds a real rollout worker
(`build_service`, a scripted engine, the real reward service) through a real Redis while nothing reads
the trajectories stream. The stream stops growing at the dispatcher's `max_inflight`, the dispatcher
stops publishing, and Redis memory (`INFO memory` used_memory) stops growing with it; once the learner
reads, the dispatcher publishes again, as many tasks as were read. Prints the figures (docs/reliability.md,
"Load")."""

from __future__ import annotations

import asyncio
import time

from searchr1.learner.dispatcher import Dispatcher
from searchr1.learner.settings import DispatcherSettings
from searchr1.learner.tools.data import Question
from searchr1.rollout.service import build_service
from searchr1.rollout.settings import RolloutSettings
from searchr1.streams import StreamKeys, tasks_stream, trajectories_stream
from tests.load.scripted_engine import ScriptedEngine
from tests.support.rollout_stack import start_reward
from tests.support.tiny_lm import build_tokenizer

MAX_INFLIGHT = 16
HOLD_S = 8.0


async def _until(what: str, check, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        await asyncio.sleep(0.1)


async def test_a_stalled_learner_stops_the_trajectories_stream_at_max_inflight(redis, redis_server, tmp_path):
    keys = StreamKeys("stall")
    tasks, groups = tasks_stream(redis, keys), trajectories_stream(redis, keys)
    await groups.ensure_group()
    published: list[int] = []
    dispatcher = Dispatcher(tasks, [Question(f"q{i}", f"question {i}?", ["a"]) for i in range(1000)],
                            DispatcherSettings(max_inflight=MAX_INFLIGHT, epochs=1, group_size=4, poll_s=0.05,
                                               paced=False),
                            on_publish=published.append)
    reward = await start_reward()
    tokenizer = build_tokenizer()
    service = await build_service(
        RolloutSettings(worker_id="w1", metrics_port=0, redis={"url": redis_server.url, "run": "stall"},
                        retriever={"addresses": ["127.0.0.1:1"]}, reward={"url": reward.url, "scorer": "searchr1_em"},
                        tasks={"max_concurrent": 4, "block_ms": 50}, weights={"download_dir": str(tmp_path / "dl")}),
        generator=ScriptedEngine(tokenizer), tokenizer=tokenizer)
    memory_before = (await redis.info("memory"))["used_memory"]
    halt, stop = asyncio.Event(), asyncio.Event()
    dispatching = asyncio.create_task(dispatcher.run(halt, downstream=groups))
    working = asyncio.create_task(service.run(stop))
    try:
        async def full() -> bool:
            return await groups.length() >= MAX_INFLIGHT and await tasks.in_flight() == 0

        await _until("the stream fills to the bound", full, 120)
        memory_at_bound = (await redis.info("memory"))["used_memory"]
        lengths, memory = [], []
        t_end = time.monotonic() + HOLD_S
        while time.monotonic() < t_end:
            lengths.append(await groups.length())
            memory.append((await redis.info("memory"))["used_memory"])
            await asyncio.sleep(0.25)
        print(f"stalled learner, max_inflight {MAX_INFLIGHT}: trajectories stream length {min(lengths)}..{max(lengths)} "
              f"over {HOLD_S:.0f} s; tasks published {sum(published)}; Redis used_memory before "
              f"{memory_before / 2**20:.2f} MiB, at the bound {memory_at_bound / 2**20:.2f} MiB, "
              f"{HOLD_S:.0f} s later {memory[-1] / 2**20:.2f} MiB (max {max(memory) / 2**20:.2f} MiB)")
        assert set(lengths) == {MAX_INFLIGHT}, "the stream stops growing at max_inflight"
        assert sum(published) == MAX_INFLIGHT, "the dispatcher stops publishing"
        assert await tasks.in_flight() == 0 and await groups.lag() == MAX_INFLIGHT
        assert max(memory) - memory_at_bound < 256 * 1024, "Redis memory stops growing with the stream"

        read = await groups.read("learner-0", count=MAX_INFLIGHT // 2)  # the learner wakes up
        await groups.ack(*[e.id for e in read])

        async def refilled() -> bool:
            return await groups.length() >= MAX_INFLIGHT + len(read) and await tasks.in_flight() == 0

        await _until("the dispatcher resumes", refilled, 120)
        await asyncio.sleep(1.0)
        assert sum(published) == MAX_INFLIGHT + len(read)
        assert await groups.lag() == MAX_INFLIGHT
    finally:
        halt.set()
        stop.set()
        await asyncio.wait_for(asyncio.gather(dispatching, working, return_exceptions=True), 30)
        await service.close()
        await reward.stop()
