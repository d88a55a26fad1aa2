"""A rollout worker's `/readyz` (what the Kubernetes startup and readiness probes ask) stays 503 while its
engine loads, though `/metrics` answers from the first moment; it turns 200 once the engine is loaded
and the worker built (the worker first contacts Redis after the engine has loaded). Real Redis; the engine is a scripted one whose start the test holds back."""

from __future__ import annotations

import asyncio

import httpx

from searchr1.core.servers import free_port
from searchr1.rollout import service as rollout_service
from searchr1.rollout.settings import RolloutSettings
from tests.load.scripted_engine import ScriptedEngine
from tests.support.tiny_lm import build_tokenizer


async def test_readyz_waits_for_the_engine(redis_server, tmp_path, monkeypatch):
    tokenizer = build_tokenizer()
    release = asyncio.Event()

    async def slow_engine(model, engine):
        await release.wait()  # vLLM loading the model
        return ScriptedEngine(tokenizer, delay_s=0.0)

    monkeypatch.setattr(rollout_service, "start_generator", slow_engine)
    port = free_port()
    settings = RolloutSettings(
        model=str(tmp_path / "unused"), worker_id="w1", metrics_port=port,
        redis={"url": redis_server.url, "run": "ready"}, retriever={"addresses": ["127.0.0.1:1"]},
        reward={"url": "http://127.0.0.1:1"}, weights={"download_dir": str(tmp_path / "dl")})
    building = asyncio.create_task(rollout_service.build_service(settings, tokenizer=tokenizer))
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=5) as client:
        for _ in range(200):
            try:
                metrics = await client.get(f"{base}/metrics")
                break
            except httpx.TransportError:
                await asyncio.sleep(0.05)
        assert metrics.status_code == 200  # the metrics server is up while the engine loads
        assert (await client.get(f"{base}/readyz")).status_code == 503
        assert (await client.get(f"{base}/healthz")).status_code == 200
        release.set()
        service = await asyncio.wait_for(building, 60)
        try:
            assert (await client.get(f"{base}/readyz")).status_code == 200
        finally:
            await service.close()
