"""`searchr1 serve rollout` as a real process: it answers /metrics once ready, rolls out tasks, and on
SIGTERM drains (the tasks in flight are published and acked) and exits 0. Slow (a vLLM engine start in a
subprocess): run with `-m slow`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from searchr1.core.schemas import SamplingParams, Task, TrajectoryGroup
from searchr1.core.servers import free_port
from searchr1.streams import StreamKeys, TypedStream, connect
from tests.support.rollout_stack import start_retriever, start_reward
from tests.support.tiny_lm import build_tiny_lm


@pytest.mark.slow
async def test_serve_rollout_process_drains_on_sigterm(redis_server, tmp_path):
    model = build_tiny_lm(tmp_path / "model")
    retriever = await start_retriever(tmp_path)
    reward = await start_reward()
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "ROLLOUT_AGENT__MAX_TURNS": "1",
           "ROLLOUT_AGENT__MAX_TOKENS_PER_TURN": "16", "ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION": "0.05",
           "ROLLOUT_ENGINE__DTYPE": "float32", "ROLLOUT_WEIGHTS__DOWNLOAD_DIR": str(tmp_path / "w")}
    cmd = [sys.executable, "-m", "searchr1.cli", "serve", "rollout", "--model", str(model),
           "--redis", redis_server.url, "--run", "cli", "--retriever", retriever.address,
           "--reward", reward.url, "--metrics-port", str(port), "--worker-id", "cli-0"]
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before the loop has other work
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    redis = connect(redis_server.url)
    keys = StreamKeys("cli")
    tasks = TypedStream(redis, keys.tasks, Task, "rollout", dead_key=keys.dead)
    groups = TypedStream(redis, keys.trajectories, TrajectoryGroup, "learner", dead_key=keys.dead)
    try:
        async with httpx.AsyncClient() as client:
            end = time.monotonic() + 600
            while True:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < end, "worker never became ready"
                try:
                    if (await client.get(f"http://127.0.0.1:{port}/metrics")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.5)
        await tasks.ensure_group()
        await groups.ensure_group()
        for i in range(3):
            await tasks.publish(Task(task_id=f"c{i}", question="what is the capital of france",
                                     golden_answers=["Paris"], group_size=2, sampling=SamplingParams(seed=i)))
        end = time.monotonic() + 120
        while await tasks.pending() == 0:
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=300)
        assert proc.returncode == 0, out
        assert "ready" in out and "drained" in out
        published = {e.value.task.task_id for e in await groups.read("t", count=10)}
        assert published  # what was taken was finished and published ...
        assert await tasks.pending() == 0  # ... and acked; the rest stays for other workers
        assert published | {f"c{i}" for i in range(3)} == {f"c{i}" for i in range(3)}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await redis.aclose()
        await reward.stop()
        await retriever.stop()
