"""A rollout worker whose vLLM engine process dies (SIGKILL, as the kernel's out-of-memory killer does):
the worker must not keep taking tasks it cannot do. It stops reading, leaves the task it held unacked
(redelivered to another worker), and `run` raises `GeneratorDead`, so the process exits for its
supervisor to restart. Real vLLM (CPU build) on the tiny model, real Redis; the retriever and reward
addresses point nowhere because the engine dies before either is called.
"""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from searchr1.core.schemas import SamplingParams, Task
from searchr1.rollout.engine import GeneratorDead
from searchr1.rollout.service import build_service
from searchr1.rollout.settings import RolloutSettings
from searchr1.streams import StreamKeys, connect, tasks_stream
from tests.support.rollout_stack import QUESTIONS, start_vllm
from tests.support.tiny_lm import build_tiny_lm


def _engine_processes() -> list[psutil.Process]:
    """vLLM's engine-core child processes of this test process."""
    return [p for p in psutil.Process(os.getpid()).children(recursive=True)
            if "EngineCore" in " ".join(p.cmdline() or [p.name()])]


@pytest.mark.asyncio
async def test_dead_engine_stops_the_worker_and_leaves_its_task_for_redelivery(redis_server, tmp_path):
    model_dir = build_tiny_lm(tmp_path / "tiny")
    gen = await start_vllm(model_dir)
    redis = connect(redis_server.url)
    try:
        engines = _engine_processes()
        assert engines, "no vLLM engine-core process found"
        for p in engines:
            os.kill(p.pid, signal.SIGKILL)
        psutil.wait_procs(engines, timeout=30)

        await redis.flushdb()
        settings = RolloutSettings(
            model=str(model_dir), worker_id="w1", metrics_port=0, redis={"url": redis_server.url, "run": "dead"},
            retriever={"addresses": ["127.0.0.1:9"]}, reward={"url": "http://127.0.0.1:9"},
            tasks={"max_concurrent": 2, "block_ms": 100})
        service = await build_service(settings, generator=gen, tokenizer=gen.tokenizer())
        tasks = tasks_stream(redis, StreamKeys("dead"))
        await tasks.ensure_group()
        q, golds = QUESTIONS[0]
        for i in range(3):
            await tasks.publish(Task(task_id=f"t{i}", question=q, golden_answers=golds, group_size=2,
                                     sampling=SamplingParams(seed=i)))
        try:
            with pytest.raises(GeneratorDead, match="engine died"):
                await asyncio.wait_for(service.run(asyncio.Event()), 120)
            pending = await tasks.pending()
            # the tasks it read stay pending (unacked) for redelivery; it stopped reading after the death
            assert 1 <= pending <= 2
            assert service.metrics.task_failures.labels("rollout")._value.get() == pending
        finally:
            await service.close()
    finally:
        await redis.aclose()
        await gen.close()
