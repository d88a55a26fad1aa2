"""Async gRPC client of the retriever service (`searchr1.retriever.v1.Retriever/Search`).

Owns: channels (created lazily inside the running event loop, one per address), a deadline per call,
retries with the shared policy of `searchr1.core.retry` (exponential backoff with jitter on UNAVAILABLE /
DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED, never on INVALID_ARGUMENT or auth errors), and round-robin over
replica addresses that skips the replica that just failed. Retries are bounded by a count and, optionally,
a deadline over all attempts; `on_retry` / `on_give_up` callbacks let the caller count them. Channels
reconnect within min(`max_backoff_s`, 1 s) of a restarted replica coming back (gRPC's default reconnect
backoff grows to two minutes, so a channel would sit in TRANSIENT_FAILURE long after the server is back).
Within one address the channel balances round-robin too: a `host:port` becomes the target `dns:///host:port`, so every replica behind one DNS
name (a headless Kubernetes service, several A records) gets its share of calls; a target that already
names a resolver (`dns:`, `ipv4:`, `ipv6:`, `unix:` …) is used as given. No numpy/torch/faiss: it lives
in core and the rollout service uses it.

Departure from Search-R1: Search-R1's trainer calls the retriever with a blocking `requests.post` and no
timeout or retry; one slow or restarting retriever stalls the whole rollout.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Self

import grpc

from searchr1.core.api import retriever_pb2, retriever_pb2_grpc
from searchr1.core.auth import grpc_metadata
from searchr1.core.retry import TRANSIENT_GRPC_CODES, retrying
from searchr1.core.settings import RetrySettings

RESOLVER_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:", "xds:")
"""Target prefixes that already name a gRPC name resolver."""


def channel_target(address: str) -> str:
    """The gRPC target of a replica address: `host:port` → `dns:///host:port` (every address the name
    resolves to, balanced round-robin); a target with a resolver scheme is returned unchanged."""
    return address if address.startswith(RESOLVER_SCHEMES) else f"dns:///{address}"


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved passage."""

    doc_id: str
    """Corpus id (wiki-18: the row id)."""
    title: str
    """First line of `contents`."""
    contents: str
    """The full wiki-18 `contents` ("Title"\\ntext), as Search-R1 returns it."""
    score: float
    """Similarity (inner product, BM25 or RRF); higher is better."""


class RetrieverError(RuntimeError):
    """A search failed for good: invalid request, auth error, or retries exhausted. `code` is the last
    gRPC status code."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def unavailable(self) -> bool:
        """True when the retriever could not be reached (retries exhausted on a transient status), as
        opposed to a refused request."""
        return self.code in TRANSIENT_GRPC_CODES

    @property
    def budget_spent(self) -> bool:
        """True when the retriever refused the search because the run's search budget is spent
        (FAILED_PRECONDITION, which the retriever answers for nothing else)."""
        return self.code == grpc.StatusCode.FAILED_PRECONDITION


class RetrieverClient:
    """`await client.search(queries, top_k)` → one list of hits per query, in order."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        token: str | None = None,
        retry: RetrySettings | None = None,
        max_message_bytes: int = 64 << 20,
        on_retry: Callable[[BaseException], None] | None = None,
        on_give_up: Callable[[str], None] | None = None,
    ) -> None:
        if isinstance(addresses, str):
            addresses = [addresses]
        if not addresses:
            raise ValueError("RetrieverClient needs at least one address")
        self.addresses = list(addresses)
        self._metadata = grpc_metadata(token)
        self.retry = (retry or RetrySettings()).retry_policy()
        self.on_retry = on_retry
        self.on_give_up = on_give_up
        reconnect_ms = int(min(self.retry.max_backoff_s, 1.0) * 1000)
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes),
                         ("grpc.lb_policy_name", "round_robin"),
                         ("grpc.initial_reconnect_backoff_ms", min(100, reconnect_ms)),
                         ("grpc.min_reconnect_backoff_ms", min(100, reconnect_ms)),
                         ("grpc.max_reconnect_backoff_ms", reconnect_ms)]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, retriever_pb2_grpc.RetrieverStub] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rr = itertools.count()

    def _stub(self, address: str) -> retriever_pb2_grpc.RetrieverStub:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # grpc.aio channels belong to the loop that made them
            self._channels, self._stubs, self._loop = {}, {}, loop
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(channel_target(address), options=self._options)
            self._channels[address] = channel
            stub = self._stubs[address] = retriever_pb2_grpc.RetrieverStub(channel)
        return stub

    async def search(self, queries: Sequence[str], top_k: int) -> list[list[Hit]]:
        """Search every query (top_k hits each). Raises RetrieverError when the request is refused or
        every attempt failed."""
        queries = list(queries)
        if not queries:
            return []
        request = retriever_pb2.SearchRequest(queries=queries, top_k=top_k)
        start = next(self._rr)
        attempts = itertools.count()
        address = self.addresses[start % len(self.addresses)]
        try:
            r = self.retry
            async for attempt in retrying(retries=r.retries, backoff_s=r.backoff_s,
                                          max_backoff_s=r.max_backoff_s, deadline_s=r.deadline_s,
                                          on_retry=self.on_retry):
                with attempt:
                    # a retry goes to the next replica
                    address = self.addresses[(start + next(attempts)) % len(self.addresses)]
                    response = await self._stub(address).Search(request, timeout=r.timeout_s,
                                                                 metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in TRANSIENT_GRPC_CODES:
                raise RetrieverError(f"retriever {address} refused the search: {exc.code().name}: "
                                     f"{exc.details()}", exc.code()) from exc
            message = (f"retriever unavailable: search failed after {next(attempts)} attempts over "
                       f"{self.addresses}: {exc.code().name}: {exc.details()}")
            if self.on_give_up is not None:
                self.on_give_up(message)
            raise RetrieverError(message, exc.code()) from exc
        if len(response.results) != len(queries):
            raise RetrieverError(f"retriever {address} answered {len(response.results)} result lists "
                                 f"for {len(queries)} queries")
        return [[Hit(h.doc_id, h.title, h.contents, float(h.score)) for h in r.hits] for r in response.results]

    async def info(self) -> dict:
        """What the first replica serves (its `Info` call: index, corpus and encoder digests, search
        settings), one attempt. Raises RetrieverError as `search` does (a replica without the call answers
        UNIMPLEMENTED)."""
        import json

        address = self.addresses[0]
        try:
            response = await self._stub(address).Info(retriever_pb2.InfoRequest(), timeout=self.retry.timeout_s,
                                                       metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise RetrieverError(f"retriever {address}: {exc.code().name}: {exc.details()}", exc.code()) from exc
        try:
            doc = json.loads(response.json)
        except ValueError as exc:
            raise RetrieverError(f"retriever {address} answered Info with no JSON: {exc}") from None
        return doc if isinstance(doc, dict) else {}

    async def close(self) -> None:
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
