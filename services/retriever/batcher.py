"""Micro-batching: concurrent requests are merged into one encode + one index search.

One asyncio task drains a queue of requests. A batch takes every request already queued (up to
`max_queries` queries), then, if it still has room, waits up to `max_wait_s` for more (0 by default:
requests that arrive while a batch runs form the next one, so batches grow with the load and a lone
request never waits). A batch smaller than the previous one also waits for the previous batch's callers
to come back, up to `refill_share` of the previous batch's search time (`refill_wait_s`): without it, N
closed-loop clients split into a lone request and the other N-1 (the first caller back starts a one-query
batch, the rest queue behind it), and every cycle pays a full one-query encode (docs/performance.md,
"Retriever"). A lone client never waits (its previous batch was as small).

It runs the search for all their queries at the largest requested k in a single worker thread (so the
event loop keeps accepting requests, and torch and FAISS never run two batches at once), cuts each
request its slice at its own k, and, on the same thread, applies the request's `finish` function (the
service turns rows into passages there), so a request costs one thread hop. A request is never split
across batches.

Departure from Search-R1: its server runs every request on its own (FastAPI's thread pool), so each pays
a full encode + search; batching amortises both (benchmarks/retriever_vs_searchr1.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from searchr1.core.aio import stop_task
from searchr1.retriever.indexes import Ranked
from searchr1.retriever.metrics import RetrieverMetrics
from searchr1.retriever.settings import BatchSettings, LimitSettings

SearchFn = Callable[[Sequence[str], int], Ranked]
Hits = list[list[tuple[int, float]]]
"""(row, score) pairs per query of one request."""
FinishFn = Callable[[Hits], Any]
"""Turns a request's hits into its answer, on the search thread."""


class QueueFull(RuntimeError):
    """More queries are waiting than the server allows; the caller should back off and retry."""


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)
    finish: FinishFn | None = field(default=None, repr=False)


def split_ranked(ranked: Ranked, sizes: Sequence[int], ks: Sequence[int]) -> list[list[list[tuple[int, float]]]]:
    """Cut a batch result back into per-request hit lists: request j owns the next `sizes[j]` query rows,
    each cut to its own `ks[j]` hits (padding rows -1 dropped)."""
    out = []
    start = 0
    for size, k in zip(sizes, ks, strict=True):
        out.append([ranked.hits(i)[:k] for i in range(start, start + size)])
        start += size
    return out


def refill_wait_s(queued: int, previous: int, previous_s: float, *, share: float, max_queries: int) -> float:
    """How long a batch of `queued` queries waits for more: up to `share` of the previous batch's search
    time `previous_s` while it is smaller than the previous batch (`previous` queries, capped at
    `max_queries`), else 0."""
    return share * previous_s if queued < min(previous, max_queries) else 0.0


class MicroBatcher:
    """Merge concurrent searches into batches; `await search(queries, k)` returns hits per query."""

    def __init__(
        self,
        search_fn: SearchFn,
        batch: BatchSettings,
        limits: LimitSettings,
        *,
        metrics: RetrieverMetrics | None = None,
    ) -> None:
        """`batch`: the `[retriever.batch]` table (how many queries a batch takes, how long it waits, the
        refill share); `limits`: the `[retriever.limits]` table (`max_queue_queries`)."""
        self._search_fn = search_fn
        self.max_queries = batch.max_queries
        self.max_wait_s = batch.max_wait_ms / 1000
        self.refill_share = batch.refill_share
        self.max_queue_queries = limits.max_queue_queries
        self._metrics = metrics
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._queued = 0
        self._carry: _Pending | None = None
        self._previous = (0, 0.0)  # (queries, search seconds) of the last batch
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-search")

    @property
    def task(self) -> asyncio.Task | None:
        """The batching loop once `start`ed: the server supervises it (`searchr1.core.supervise`); every
        search would wait for good on a loop that died."""
        return self._task

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="retriever-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task, timeout=10.0)
            self._task = None
        self._executor.shutdown(wait=True, cancel_futures=True)

    def run_sync(self, fn: Callable, *args):
        """Run `fn` on the search thread (e.g. thread-count set-up that must happen on that thread)."""
        return self._executor.submit(fn, *args).result()

    async def search(self, queries: Sequence[str], k: int, *, finish: FinishFn | None = None) -> Any:
        """Hits per query (row, score), or `finish(hits)` computed on the search thread."""
        if self._task is None:
            raise RuntimeError("MicroBatcher.start() was not awaited")
        if self._queued + len(queries) > self.max_queue_queries:
            raise QueueFull(f"{self._queued} queries already waiting (limit {self.max_queue_queries})")
        fut = asyncio.get_running_loop().create_future()
        self._queued += len(queries)
        self._gauge()
        await self._queue.put(_Pending(list(queries), k, fut, finish))
        return await fut

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_queries.set(self._queued)

    async def _next_batch(self) -> list[_Pending]:
        first = self._carry or await self._queue.get()
        self._carry = None
        batch, n = [first], len(first.queries)
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.max_wait_s
        previous, previous_s = self._previous
        while n < self.max_queries:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                refill = refill_wait_s(n, previous, previous_s, share=self.refill_share,
                                       max_queries=self.max_queries)
                remaining = max(deadline, start + refill) - loop.time()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        item = await self._queue.get()
                except TimeoutError:
                    break
            if n + len(item.queries) > self.max_queries:
                self._carry = item
                break
            batch.append(item)
            n += len(item.queries)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            queries = [q for p in batch for q in p.queries]
            self._queued -= len(queries)
            self._gauge()
            live = [p for p in batch if not p.future.done()]  # callers that gave up are skipped
            if not live:
                continue
            queries = [q for p in live for q in p.queries]
            k = max(p.k for p in live)
            t0 = time.perf_counter()
            try:
                answers = await loop.run_in_executor(self._executor, self._search_batch, live, queries, k)
            except Exception as exc:  # noqa: BLE001 - one failed batch fails its requests, never the batcher
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            elapsed = time.perf_counter() - t0
            self._previous = (len(queries), elapsed)
            if self._metrics is not None:
                self._metrics.batch_queries.observe(len(queries))
                self._metrics.batch_seconds.observe(elapsed)
                self._metrics.queries.inc(len(queries))
            for p, (ok, answer) in zip(live, answers, strict=True):
                if not p.future.done():
                    if ok:
                        p.future.set_result(answer)
                    else:
                        p.future.set_exception(answer)

    def _search_batch(self, live: list[_Pending], queries: list[str], k: int) -> list[tuple[bool, Any]]:
        """On the search thread: one search, cut per request, each request's `finish` applied; a failing
        `finish` fails only its own request."""
        ranked = self._search_fn(queries, k)
        answers: list[tuple[bool, Any]] = []
        for p, hits in zip(live, split_ranked(ranked, [len(p.queries) for p in live], [p.k for p in live]),
                           strict=True):
            try:
                answers.append((True, p.finish(hits) if p.finish is not None else hits))
            except Exception as exc:  # noqa: BLE001 - handed to that request's caller
                answers.append((False, exc))
        return answers
