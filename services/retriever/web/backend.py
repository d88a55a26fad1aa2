"""A web search API as the retriever's search backend: `await backend.search(queries, top_k)` answers
like the local index does (one list of hits per query), through these stages per query:

    identical query already being answered? wait for its answer → cache → budget → concurrency cap →
    token bucket → HTTP request (retried on 429/5xx/timeouts by `searchr1.core.retry`) → adapter → cache

What fails how: the budget spent → `BudgetExhausted` (gRPC FAILED_PRECONDITION, HTTP 402); the provider
unreachable or refusing after the bounded retries, or the budget's counter (Redis) unreachable →
`BackendUnavailable` (gRPC UNAVAILABLE, HTTP 503); an answer that is not the documented JSON → that query
gets no hits (counted as `malformed`, not cached, not billed), so one bad page never fails a whole batch
or crashes the service. With page reading on
(`pages.enabled`), the adapter's results are replaced by the best chunks of their pages
(`retriever/web/pages.py`), cached under their own key.

The API key is sent only in the request (header or, for SerpAPI, the query string) and redacted from
httpx's request log lines; it never reaches our logs, metrics or cache keys.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import httpx

from searchr1.core.clients.retriever import Hit
from searchr1.core.retry import TransientHTTPStatus, is_transient, retrying
from searchr1.retriever.web.adapters import (
    MalformedResponse,
    Provider,
    WebRequest,
    WebResult,
    build_request,
    parse_response,
)
from searchr1.retriever.web.cache import Cache, cache_key
from searchr1.retriever.web.limits import Budget, BudgetExhausted, TokenBucket
from searchr1.retriever.web.metrics import WebMetrics
from searchr1.retriever.web.pages import PageReader
from searchr1.retriever.web.settings import WebSettings

log = logging.getLogger("searchr1.retriever.web")


class BackendUnavailable(RuntimeError):
    """The search API could not answer within the bounded retries, or refused the request (bad key)."""


class ProviderRefused(Exception):
    """A 4xx other than 429: the request's fault (a bad key, a bad parameter); not retried."""


class RedactSecret(logging.Filter):
    """Replaces a secret in log records (httpx logs every request URL at INFO, SerpAPI's key included)."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.secret in message:
            record.msg, record.args = message.replace(self.secret, "[redacted]"), ()
        return True


def outcome_of(exc: BaseException) -> tuple[str, str]:
    """(`requests_total` outcome, `errors_total` reason) of a failed request."""
    if isinstance(exc, TransientHTTPStatus):
        code = exc.response.status_code
        return ("429", "rate_limited") if code == 429 else ("5xx", "server_error")
    if isinstance(exc, ProviderRefused):
        return "4xx", "refused"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", "timeout"
    return "transport", "transport"


def to_hits(results: Sequence[WebResult]) -> list[Hit]:
    return [Hit(r.url, r.title, r.contents, r.score) for r in results]


class WebBackend:
    """Search a web API (see the module docstring). Dependencies are passed in; `close()` closes the
    HTTP client and the cache."""

    def __init__(self, settings: WebSettings, client: httpx.AsyncClient, cache: Cache, budget: Budget,
                 metrics: WebMetrics, *, api_key: str | None = None, reader: PageReader | None = None) -> None:
        self.settings = settings
        self.provider: Provider = settings.provider
        self.base_url = settings.resolved_base_url()
        self.api_key = api_key
        self.client, self.cache, self.budget, self.metrics = client, cache, budget, metrics
        self.bucket = TokenBucket(settings.requests_per_s, settings.burst)
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._inflight: dict[str, asyncio.Task[list[WebResult]]] = {}
        self.reader = reader
        self._cache_tag = f"{self.provider}+pages" if reader is not None else self.provider
        self._redact = RedactSecret(api_key) if api_key else None
        if self._redact is not None:
            logging.getLogger("httpx").addFilter(self._redact)
        self._publish_budget()

    @property
    def info(self) -> dict[str, str]:
        return {"backend": "web", "provider": self.provider}

    async def search(self, queries: Sequence[str], top_k: int) -> list[list[Hit]]:
        """One list of at most `top_k` hits per query, in order."""
        return list(await asyncio.gather(*(self.search_one(q, top_k) for q in queries)))

    async def search_one(self, query: str, top_k: int) -> list[Hit]:
        num = max(top_k, self.settings.fetch_results)
        key = cache_key(self._cache_tag, num, query)
        m, label = self.metrics, self.provider
        m.queries.labels(label).inc()
        answer = self._inflight.get(key)
        if answer is not None:  # the same query from another trajectory of the group: its answer, no request
            m.cache_hits.labels(label).inc()
        else:
            # one task answers `key` (cache, else the API) and leaves `_inflight` only once its answer is
            # cached, so one normalised query costs one request; it runs on when a caller is cancelled
            answer = self._inflight[key] = asyncio.create_task(self._answer(key, query, num))
            answer.add_done_callback(lambda task: self._answered(key, task))
        return to_hits((await asyncio.shield(answer))[:top_k])

    def _answered(self, key: str, task: asyncio.Task) -> None:
        del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning when every caller went away

    async def _answer(self, key: str, query: str, num: int) -> list[WebResult]:
        results = await self._cache_get(key)
        if results is not None:
            self.metrics.cache_hits.labels(self.provider).inc()
            return results
        fetched = await self._fetch(query, num)
        if fetched is not None:  # a valid answer, even an empty one; a malformed one is asked again
            await self._cache_put(key, fetched)
        return fetched or []

    async def _fetch(self, query: str, num: int) -> list[WebResult] | None:
        """Budget → slot → bucket → request with retries → adapter (None: the answer was malformed).
        Releases the budget unless billed."""
        m, label = self.metrics, self.provider
        try:
            await self.budget.reserve()
        except BudgetExhausted:
            m.errors.labels(label, "budget").inc()
            raise
        except Exception as exc:  # noqa: BLE001 - no counter, no spending: unavailable until it is back
            m.errors.labels(label, "budget_store").inc()
            raise BackendUnavailable(f"the search budget's counter is unreachable ({exc.__class__.__name__})") from None
        billed = False
        try:
            async with self._slots:
                body = await self._request(build_request(self.provider, self.base_url, query, num, self.api_key))
            try:
                parsed = parse_response(self.provider, body, num, max_title_chars=self.settings.max_title_chars,
                                        max_snippet_chars=self.settings.max_snippet_chars)
            except MalformedResponse as exc:
                m.errors.labels(label, "malformed").inc()
                log.warning("%s answered a malformed body for one query: %s", label, exc)
                return None
            billed = True
            if parsed.skipped:
                m.errors.labels(label, "missing_fields").inc(parsed.skipped)
            if parsed.truncated:
                m.errors.labels(label, "truncated").inc(parsed.truncated)
            if self.reader is not None and parsed.results:
                return await self.reader.read(query, parsed.results, num)
            return parsed.results
        finally:
            if not billed:
                await self._release()
            self._publish_budget()

    async def _release(self) -> None:
        try:
            await self.budget.release()
        except Exception as exc:  # noqa: BLE001 - the reservation stays counted: the budget errs on the safe side
            self.metrics.errors.labels(self.provider, "budget_store").inc()
            log.warning("could not give back an unbilled query to the budget (%s)", exc.__class__.__name__)

    async def _request(self, request: WebRequest) -> bytes:
        """The answer body of `request`, retried on transient failures; BackendUnavailable when none came."""
        m, label = self.metrics, self.provider
        s = self.settings
        t0 = time.perf_counter()
        try:
            async for attempt in retrying(retries=s.retries, backoff_s=s.backoff_s, max_backoff_s=s.max_backoff_s,
                                          deadline_s=s.deadline_s, retry_if=is_transient):
                with attempt:
                    await self.bucket.acquire()
                    try:
                        body = await self._send(request)
                    except Exception as exc:
                        outcome, reason = outcome_of(exc)
                        m.requests.labels(label, outcome).inc()
                        m.errors.labels(label, reason).inc()
                        raise
                    m.requests.labels(label, "ok").inc()
        except (httpx.HTTPError, TransientHTTPStatus, ProviderRefused) as exc:
            m.errors.labels(label, "gave_up").inc()
            reason = str(exc).replace(self.api_key, "[redacted]") if self.api_key else str(exc)
            raise BackendUnavailable(f"{label} search API failed: {exc.__class__.__name__}: {reason}") from None
        finally:
            m.latency.labels(label).observe(time.perf_counter() - t0)
        return body

    async def _send(self, request: WebRequest) -> bytes:
        async with self.client.stream(request.method, request.url, params=request.params or None,
                                      json=request.json, headers=request.headers,
                                      timeout=self.settings.timeout_s) as response:
            if response.status_code != 200:
                if response.status_code == 429 or response.status_code >= 500:
                    raise TransientHTTPStatus(response)
                raise ProviderRefused(f"HTTP {response.status_code}")
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self.settings.max_body_bytes:
                    return b"<body over max_body_bytes>"  # parsed as malformed: counted, no hits
                chunks.append(chunk)
        return b"".join(chunks)

    async def _cache_get(self, key: str) -> list[WebResult] | None:
        try:
            return await self.cache.get(key)
        except Exception as exc:  # noqa: BLE001 - a cache that fails is a miss, not a failed search
            self.metrics.errors.labels(self.provider, "cache").inc()
            log.warning("web cache read failed (%s); searching without it", exc.__class__.__name__)
            return None

    async def _cache_put(self, key: str, results: list[WebResult]) -> None:
        try:
            await self.cache.put(key, results)
        except Exception as exc:  # noqa: BLE001
            self.metrics.errors.labels(self.provider, "cache").inc()
            log.warning("web cache write failed (%s)", exc.__class__.__name__)

    def _publish_budget(self) -> None:
        m, label = self.metrics, self.provider
        m.billed.labels(label).set(self.budget.used)
        m.spend.labels(label).set(self.budget.spent)
        m.budget_used.labels(label).set(self.budget.used_ratio)

    async def close(self) -> None:
        if self.reader is not None:
            await self.reader.client.aclose()
        if self._redact is not None:
            logging.getLogger("httpx").removeFilter(self._redact)
        await self.client.aclose()
        await self.cache.close()
