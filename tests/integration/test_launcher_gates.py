"""Health gates against real servers (core GrpcServer/HttpServer, real Redis), and the status collector
reading real Redis streams and weight announcements."""

from __future__ import annotations

import json

from searchr1.core.schemas import WeightVersion
from searchr1.core.servers import GrpcServer, HttpServer, free_port
from searchr1.launcher.health import GrpcHealthGate, HttpGate, RedisPingGate, check_all
from searchr1.launcher.status import StatusCollector, render_status
from searchr1.streams import StreamKeys
from searchr1.weightsync import announce


def _app(status: dict):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        code = status.get(scope["path"], 404)
        body = status.get("body", b"")
        await send({"type": "http.response.start", "status": code, "headers": []})
        await send({"type": "http.response.body", "body": body})
    return app


async def test_grpc_health_gate():
    server = GrpcServer("127.0.0.1", 0)
    port = await server.start()
    try:
        assert await GrpcHealthGate(f"127.0.0.1:{port}").check() == (
            True, f"gRPC health at 127.0.0.1:{port}: SERVING")
        ok, detail = await GrpcHealthGate(f"127.0.0.1:{port}", service="no.such.Service").check()
        assert not ok and "NOT_FOUND" in detail
        await server._health.enter_graceful_shutdown()  # draining: NOT_SERVING
        ok, detail = await GrpcHealthGate(f"127.0.0.1:{port}").check()
        assert not ok and detail.endswith("NOT_SERVING")
    finally:
        await server.stop(0)
    ok, detail = await GrpcHealthGate(f"127.0.0.1:{free_port()}").check()
    assert not ok and "UNAVAILABLE" in detail


async def test_http_gate():
    status = {"/healthz": 503}
    server = HttpServer(_app(status), "127.0.0.1", 0)
    await server.start()
    try:
        gate = HttpGate(f"{server.url}/healthz")
        assert await gate.check() == (False, f"GET {server.url}/healthz: HTTP 503")
        status["/healthz"] = 200
        assert await gate.check() == (True, f"GET {server.url}/healthz: HTTP 200")
        both = [gate, HttpGate(f"{server.url}/metrics")]
        assert await check_all(both) == (False, f"GET {server.url}/metrics: HTTP 404")
    finally:
        await server.stop()
    ok, detail = await HttpGate(f"http://127.0.0.1:{free_port()}/healthz").check()
    assert not ok and "ConnectError" in detail


async def test_redis_gate(redis_server):
    assert (await RedisPingGate(redis_server.url).check())[0]
    ok, detail = await RedisPingGate(f"redis://127.0.0.1:{free_port()}/0").check()
    assert not ok and "ConnectionError" in detail


async def test_status_collector_reads_redis_jsonl_and_metrics(redis, redis_server, tmp_path):
    keys = StreamKeys("s1")
    jsonl = tmp_path / "m.jsonl"
    metrics = {"/metrics": 200, "body": b"searchr1_learner_step 9\nsearchr1_learner_em 0.5\n"}
    server = HttpServer(_app(metrics), "127.0.0.1", 0)
    await server.start()
    collector = StatusCollector(
        redis_url=redis_server.url, run="s1", metrics_jsonl=jsonl, learner_metrics_url=f"{server.url}/metrics",
        jsonl_keys={"step": ["step"], "reward_mean": ["reward_mean"], "em": ["em"],
                    "searches_per_question": ["searches"]},
        prometheus_names={"step": ["searchr1_learner_step"], "em": ["searchr1_learner_em"]},
        started_at=0.0)
    try:
        # nothing yet: no streams, no JSONL, learner not scraped until it is up
        snap = await collector.collect()
        assert (snap.step, snap.tasks_lag, snap.tasks_pending, snap.weight_version) == (None, None, None, None)
        # tasks: 4 added, 1 delivered to a worker and not acked → lag 3, pending 1
        await redis.xgroup_create(keys.tasks, "rollout", id="0", mkstream=True)
        for _ in range(4):
            await redis.xadd(keys.tasks, {b"m": b"x"})
        await redis.xreadgroup("rollout", "w0", {keys.tasks: ">"}, count=1)
        await redis.xgroup_create(keys.trajectories, "learner", id="0", mkstream=True)
        await redis.xadd(keys.trajectories, {b"m": b"x"})
        await announce(redis, keys, WeightVersion(version=5, uri="/w", sha256="a" * 64))
        jsonl.write_text(json.dumps({"step": 3, "reward_mean": 0.25, "searches": 1.5}) + "\n")
        snap = await collector.collect()
        assert (snap.tasks_lag, snap.tasks_pending, snap.trajectories_lag, snap.trajectories_pending) == (3, 1, 1, 0)
        assert (snap.weight_version, snap.step, snap.reward_mean, snap.em) == (5, 3.0, 0.25, None)
        collector.scrape_learner = True  # the JSONL wins; /metrics fills in what it lacks
        snap = await collector.collect()
        assert (snap.step, snap.reward_mean, snap.em, snap.searches_per_question) == (3.0, 0.25, 0.5, 1.5)
        assert render_status(snap).startswith("step 3 · reward 0.250 · EM 0.500 · searches/q 1.50 · tasks 3+1 · "
                                              "trajectories 1+0 · weights v5 · ")
    finally:
        await server.stop()
        await collector.close()
    # the learner gone: its numbers blank out from /metrics, the JSONL still answers
    jsonl.unlink()
    snap = await collector.collect()
    assert (snap.step, snap.em, snap.weight_version) == (None, None, 5)
    await collector.close()
