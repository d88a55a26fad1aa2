"""A small async micro-batcher for searches: many trajectories call `search(query)` concurrently; the
batcher sends their queries to the retriever as ONE `search(queries, top_k)` call (gRPC) when
`max_batch` queries are waiting or `max_wait_s` has passed since the first one, and hands each caller
its own hits. A failed call fails every caller of that batch (the agent ends those trajectories with
`error`); the next batch is unaffected.

It does not retry (the retriever client does) and does not cache.

Queries are made safe for the retriever's request bounds here, so one trajectory's odd query can never
fail its batch-mates: a blank query (`<search> </search>`) gets no hits without a call, and a query
longer than `max_query_chars` is cut to that length. Departure from Search-R1, which sends the empty
string to its dense retriever and shows whatever comes back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from searchr1.rollout.settings import RetrieverClientSettings


class SearchBackend(Protocol):
    """What the batcher calls: `RetrieverClient.search` has this signature."""

    async def search(self, queries: Sequence[str], top_k: int) -> list[list[Any]]: ...


class SearchBatcher:
    """Coalesce concurrent single-query searches into batched backend calls."""

    def __init__(
        self,
        backend: SearchBackend,
        settings: RetrieverClientSettings,
        *,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        """`settings`: the `[rollout.retriever]` table (`top_k`, `max_batch`, `max_wait_ms`,
        `max_query_chars`; the retry knobs are the backend's)."""
        self.max_query_chars = settings.max_query_chars
        self.backend = backend
        self.top_k = settings.top_k
        self.max_batch = settings.max_batch
        self.max_wait_s = settings.max_wait_ms / 1000
        self.on_batch = on_batch
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()

    async def search(self, query: str) -> list[Any]:
        """The hits for one query (batched with whatever else is waiting)."""
        query = query.strip()[: self.max_query_chars]
        if not query:
            return []
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._pending.append((query, fut))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush)
        return await fut

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[str, asyncio.Future]]) -> None:
        try:
            await self._answer(batch)
        finally:  # a batch task that died any other way (cancelled, a callback raising) fails its callers too
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(RuntimeError("the search batch ended without an answer"))

    async def _answer(self, batch: list[tuple[str, asyncio.Future]]) -> None:
        t0 = time.perf_counter()
        try:
            results = await self.backend.search([q for q, _ in batch], self.top_k)
            if len(results) != len(batch):
                raise RuntimeError(f"retriever answered {len(results)} result lists for {len(batch)} queries")
        except Exception as exc:  # noqa: BLE001 - one failed call fails its callers, never the batcher
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        finally:
            if self.on_batch is not None:
                self.on_batch(len(batch), time.perf_counter() - t0)
        for (_, fut), hits in zip(batch, results):
            if not fut.done():
                fut.set_result(hits)
