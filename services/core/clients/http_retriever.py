"""Async client of a Search-R1 retrieval server's HTTP API (`POST /retrieve`), so a retriever started with
Search-R1's own `retrieval_server.py` (or any server speaking its JSON) can serve our rollouts, evaluations
and `searchr1 ask`; ours answers the same endpoint.

Request `{"queries": [...], "topk": k, "return_scores": true}`; answer `{"result": [[{"document": {"id",
"contents"}, "score"}, …], …]}` (or, from a server that ignores `return_scores`, the bare documents). Hits
come back as `searchr1.core.clients.retriever.Hit` (title = first line of `contents`, quotes stripped as
Search-R1's `_passages2string` does), so the agent loop cannot tell the two clients apart.

Errors are `RetrieverError` with the gRPC status the same failure has on our gRPC API, so the agent loop's
finish reasons and the evaluation's preflight read them alike: connection errors, timeouts, 429 and 5xx are
UNAVAILABLE (retried with the shared policy, `searchr1.core.retry`), 401/403 UNAUTHENTICATED/PERMISSION_DENIED,
402 FAILED_PRECONDITION (a spent search budget), other 4xx INVALID_ARGUMENT; an answer that is not the shape
above is INTERNAL.

Departure from Search-R1: its trainer posts with `requests` and no timeout or retry; this client has both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Self

import grpc
import httpx

from searchr1.core.auth import http_headers
from searchr1.core.clients.retriever import Hit, RetrieverError
from searchr1.core.retry import TransientHTTPStatus, is_transient_http_status, retrying
from searchr1.core.settings import RetrySettings

_STATUS_CODES = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED,
                 402: grpc.StatusCode.FAILED_PRECONDITION}


def is_http_address(address: str) -> bool:
    """True for a retriever address given as an http(s) URL (a `/retrieve` server), False for host:port."""
    return address.startswith(("http://", "https://"))


def _title(contents: str) -> str:
    return contents.split("\n", 1)[0].strip().strip('"')


def parse_retrieve_answer(doc: Any, n_queries: int) -> list[list[Hit]]:
    """Search-R1's `/retrieve` answer → hits per query; ValueError for any other shape."""
    if not isinstance(doc, dict) or not isinstance(doc.get("result"), list):
        raise ValueError("no `result` list")
    result = doc["result"]
    if len(result) != n_queries:
        raise ValueError(f"{len(result)} result lists for {n_queries} queries")
    out = []
    for hits in result:
        if not isinstance(hits, list):
            raise ValueError("a result entry is not a list")
        row = []
        for rank, item in enumerate(hits):
            if not isinstance(item, dict):
                raise ValueError("a hit is not an object")
            document = item.get("document", item)
            if not isinstance(document, dict) or not isinstance(document.get("contents"), str):
                raise ValueError("a hit has no `contents` string")
            score = item.get("score", -rank)
            row.append(Hit(str(document.get("id", "")), _title(document["contents"]), document["contents"],
                           float(score) if isinstance(score, int | float) else float(-rank)))
        out.append(row)
    return out


class HttpRetrieverClient:
    """`await client.search(queries, top_k)` → one list of hits per query, from a `/retrieve` server at
    `url` (replicas: several URLs, round-robin, a retry goes to the next)."""

    def __init__(self, urls: str | Sequence[str], *, token: str | None = None, retry: RetrySettings | None = None,
                 on_retry: Callable[[BaseException], None] | None = None,
                 on_give_up: Callable[[str], None] | None = None) -> None:
        self.addresses = [urls] if isinstance(urls, str) else list(urls)
        if not self.addresses:
            raise ValueError("HttpRetrieverClient needs at least one URL")
        self.retry = (retry or RetrySettings()).retry_policy()
        self.on_retry = on_retry
        self.on_give_up = on_give_up
        self._headers = http_headers(token)
        self._http: httpx.AsyncClient | None = None
        self._next = 0

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(headers=self._headers, timeout=self.retry.timeout_s)
        return self._http

    def _url(self, attempt: int, path: str) -> str:
        return self.addresses[(self._next + attempt) % len(self.addresses)].rstrip("/") + path

    async def search(self, queries: Sequence[str], top_k: int) -> list[list[Hit]]:
        """Search every query (top_k hits each); RetrieverError when refused or every attempt failed."""
        queries = list(queries)
        if not queries:
            return []
        body = {"queries": queries, "topk": top_k, "return_scores": True}
        r = self.retry
        attempts = 0
        self._next += 1
        url = self._url(0, "/retrieve")
        try:
            async for attempt in retrying(retries=r.retries, backoff_s=r.backoff_s, max_backoff_s=r.max_backoff_s,
                                          deadline_s=r.deadline_s, on_retry=self.on_retry):
                with attempt:
                    url = self._url(attempts, "/retrieve")
                    attempts += 1
                    response = await self._client().post(url, json=body, timeout=r.timeout_s)
                    if is_transient_http_status(response.status_code):
                        raise TransientHTTPStatus(response, response.text[:200])
        except (httpx.TransportError, TransientHTTPStatus) as exc:
            message = (f"retriever unavailable: search failed after {attempts} attempts over {self.addresses}: "
                       f"{type(exc).__name__}: {exc}")
            if self.on_give_up is not None:
                self.on_give_up(message)
            raise RetrieverError(message, grpc.StatusCode.UNAVAILABLE) from exc
        if response.status_code >= 400:
            code = _STATUS_CODES.get(response.status_code, grpc.StatusCode.INVALID_ARGUMENT)
            raise RetrieverError(f"retriever {url} refused the search: {code.name}: HTTP {response.status_code} "
                                 f"{response.text[:200]}", code)
        try:
            return parse_retrieve_answer(response.json(), len(queries))
        except (ValueError, json.JSONDecodeError) as exc:
            raise RetrieverError(f"retriever {url} answered no Search-R1 /retrieve result: {exc}",
                                 grpc.StatusCode.INTERNAL) from None

    async def info(self) -> dict:
        """What the server serves, from `GET /healthz` (ours lists its index there; a Search-R1 server has
        no such endpoint: {})."""
        try:
            response = await self._client().get(self._url(0, "/healthz"), timeout=self.retry.timeout_s)
        except httpx.TransportError as exc:
            raise RetrieverError(f"retriever {self.addresses[0]} does not answer: {exc}",
                                 grpc.StatusCode.UNAVAILABLE) from exc
        if response.status_code != 200:
            return {}
        try:
            doc = response.json()
        except ValueError:
            return {}
        return {k: v for k, v in doc.items() if k != "status"} if isinstance(doc, dict) else {}

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def retriever_client(addresses: Sequence[str], *, token: str | None = None, retry: RetrySettings | None = None,
                     **callbacks: Any) -> Any:
    """The client for `addresses`: `HttpRetrieverClient` when they are http(s) URLs of `/retrieve` servers,
    else the gRPC `RetrieverClient`; mixing the two is a ValueError."""
    from searchr1.core.clients.retriever import RetrieverClient

    http = [is_http_address(a) for a in addresses]
    if any(http) and not all(http):
        raise ValueError(f"retriever addresses mix http(s) URLs and host:port: {list(addresses)}")
    if addresses and all(http):
        return HttpRetrieverClient(addresses, token=token, retry=retry, **callbacks)
    return RetrieverClient(addresses, token=token, retry=retry, **callbacks)
