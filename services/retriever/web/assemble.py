"""Build a `WebBackend` from `WebSettings`: the HTTP client, the cache (Redis or SQLite), the budget
counter (in Redis with the Redis cache, else in the process) and the metrics on the retriever's registry.
A Redis cache needs a Redis of its own with a memory bound and a `volatile-*` eviction policy
(`check_cache_redis`), never the run's streams Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from searchr1.core.redaction import redact_url
from searchr1.retriever.web.backend import WebBackend
from searchr1.retriever.web.cache import Cache, NoCache, RedisCache, SqliteCache
from searchr1.retriever.web.limits import Budget, LocalCounter, RedisCounter
from searchr1.retriever.web.metrics import WebMetrics
from searchr1.retriever.web.pages import PageReader, encoder_scorer
from searchr1.retriever.web.settings import WebSettings
from searchr1.streams import connect


def redis_prefix(run: str) -> str:
    return f"searchr1:{run}:retriever:web:"


class CacheRedisRefused(ValueError):
    """The cache's Redis would keep every cached answer until it refused writes (see `check_cache_redis`)."""


async def check_cache_redis(client: Any, url: str) -> None:
    """Refuse a cache Redis without `maxmemory` or with a `maxmemory-policy` other than `volatile-*`.

    Cached answers carry a TTL and the budget counter none: under `volatile-lru` (or another `volatile-*`
    policy) a full Redis evicts old answers and never the counter. Under `noeviction` (what the run's
    streams Redis runs: it must refuse writes rather than lose entries) the answers would fill it and then
    refuse every write, the streams' included; under `allkeys-*` the budget counter could be evicted."""
    info = await client.info("memory")
    policy, maxmemory = str(info.get("maxmemory_policy", "")), int(info.get("maxmemory", 0))
    if maxmemory > 0 and policy.startswith("volatile-"):
        return
    raise CacheRedisRefused(
        f"the web cache's Redis ({redact_url(url)}) runs maxmemory {maxmemory} with policy {policy!r}: cached "
        "answers would grow until it refuses writes (the run's streams too, if it is their Redis). Give the "
        "cache a Redis of its own with a memory bound and a volatile policy (`redis-server --port 6380 "
        "--maxmemory 512mb --maxmemory-policy volatile-lru`), or use web.cache.kind = \"sqlite\"")


async def open_web_backend(settings: WebSettings, metrics: WebMetrics) -> WebBackend:
    """A ready backend (the budget counter read, so a restarted retriever continues the run's count)."""
    api_key = settings.resolved_api_key()
    if api_key is None and settings.provider != "searxng":
        raise ValueError(f"the {settings.provider} backend needs an API key: set RETRIEVER_WEB__API_KEY, "
                         "web.api_key_env or web.api_key_file")
    c = settings.cache
    counter = LocalCounter()
    cache: Cache = NoCache()
    if c.kind == "redis":
        client = connect(c.redis_url)
        try:
            await check_cache_redis(client, c.redis_url)
        except BaseException:
            await client.aclose()
            raise
        prefix = redis_prefix(c.run)
        cache = RedisCache(client, prefix + "cache:", c.ttl_s, owns_client=True)
        counter = RedisCounter(client, f"{prefix}billed:{settings.provider}")
    elif c.kind == "sqlite":
        cache = await asyncio.to_thread(SqliteCache, c.path, c.ttl_s)
    b = settings.budget
    budget = Budget(counter, max_queries=b.max_queries, price_per_1000=b.price_per_1000, max_spend=b.max_spend)
    await budget.load()
    limits = httpx.Limits(max_connections=settings.max_concurrency, max_keepalive_connections=settings.max_concurrency)
    client = httpx.AsyncClient(limits=limits, follow_redirects=False)
    reader = await asyncio.to_thread(open_page_reader, settings, metrics) if settings.pages.enabled else None
    return WebBackend(settings, client, cache, budget, metrics, api_key=api_key, reader=reader)


def open_page_reader(settings: WebSettings, metrics: WebMetrics) -> PageReader:
    """The page reader (its own HTTP client: pages never see the API's headers), ranking with the
    configured encoder when there is one (loaded here: blocking, so called in a thread)."""
    p = settings.pages
    scorer = None
    if p.encoder:
        from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder, resolve_convention

        scorer = encoder_scorer(TransformerEncoder(EncoderSpec(p.encoder, resolve_convention("auto", p.encoder))))
    failed = metrics.errors.labels(settings.provider, "page_failed")
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=4 * settings.max_concurrency),
                               follow_redirects=False)
    return PageReader(client, p, scorer=scorer, on_failure=lambda reason: failed.inc())
