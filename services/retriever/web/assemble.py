"""Build a `WebBackend` from `WebSettings`: the HTTP client, the cache (Redis or SQLite), the budget
counter (in Redis with the Redis cache, else in the process) and the metrics on the retriever's registry."""

from __future__ import annotations

import asyncio

import httpx

from searchr1.core.streams import connect
from searchr1.retriever.web.backend import WebBackend
from searchr1.retriever.web.cache import Cache, NoCache, RedisCache, SqliteCache
from searchr1.retriever.web.limits import Budget, LocalCounter, RedisCounter
from searchr1.retriever.web.metrics import WebMetrics
from searchr1.retriever.web.settings import WebSettings


def redis_prefix(run: str) -> str:
    return f"searchr1:{run}:retriever:web:"


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
    return WebBackend(settings, client, cache, budget, metrics, api_key=api_key)
