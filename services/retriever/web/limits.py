"""What a web backend may spend: a token bucket (requests per second with a burst), and a run budget in
queries or money (a price per 1,000 queries). The arithmetic is in pure functions; the classes add the
clock, the waiting and the counter.

The budget counts billed queries: a request is reserved before it is sent (so concurrent requests
never overshoot the budget) and given back when the provider did not answer it (transport error, 429,
5xx: providers bill answered queries). The counter lives in Redis when the cache does (every replica of
a run draws on one budget, and a restarted retriever does not start from zero) or in the process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol


class BudgetExhausted(RuntimeError):
    """The run's search budget is spent; the service answers FAILED_PRECONDITION / HTTP 402 and the rollout
    ends the trajectory with finish reason `search_budget`."""


def refill(tokens: float, elapsed_s: float, rate: float, burst: float) -> float:
    """Tokens after `elapsed_s` seconds at `rate` per second, capped at `burst`."""
    return min(burst, tokens + max(0.0, elapsed_s) * rate)


def wait_for_token(tokens: float, rate: float) -> float:
    """Seconds until one whole token is available (0 when one is)."""
    return 0.0 if tokens >= 1.0 else (1.0 - tokens) / rate


def spend(queries: int, price_per_1000: float) -> float:
    """Money spent on `queries` billed queries."""
    return queries * price_per_1000 / 1000.0


def within_budget(queries: int, max_queries: int | None, price_per_1000: float, max_spend: float | None) -> bool:
    """Whether `queries` billed queries stay inside both bounds (None: no bound)."""
    if max_queries is not None and queries > max_queries:
        return False
    return max_spend is None or spend(queries, price_per_1000) <= max_spend + 1e-12


class TokenBucket:
    """`await bucket.acquire()` returns once a request may be sent: at most `burst` at once, then `rate`
    per second. Waiters are served in arrival order."""

    def __init__(self, rate: float, burst: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate, self.burst = rate, burst
        self._clock, self._sleep = clock, sleep
        self._tokens, self._last = burst, clock()
        self._lock = asyncio.Lock()

    async def acquire(self) -> float:
        """Take one token; returns the seconds waited."""
        waited = 0.0
        async with self._lock:
            while True:
                now = self._clock()
                self._tokens, self._last = refill(self._tokens, now - self._last, self.rate, self.burst), now
                delay = wait_for_token(self._tokens, self.rate)
                if delay == 0.0:
                    self._tokens -= 1.0
                    return waited
                await self._sleep(delay)
                waited += delay


class Counter(Protocol):
    """A shared integer: `add(n)` returns the value after adding n."""

    async def add(self, n: int) -> int: ...


class LocalCounter:
    """The budget counter of one process."""

    def __init__(self) -> None:
        self.value = 0

    async def add(self, n: int) -> int:
        self.value += n
        return self.value


class RedisCounter:
    """The budget counter in Redis (INCRBY on one key), shared by every replica of a run."""

    def __init__(self, client, key: str) -> None:
        self.client, self.key = client, key

    async def add(self, n: int) -> int:
        return int(await self.client.incrby(self.key, n))


class Budget:
    """A run's budget: `reserve()` before a request (BudgetExhausted when it would overshoot), `release()`
    when the request was not billed."""

    def __init__(self, counter: Counter, *, max_queries: int | None, price_per_1000: float,
                 max_spend: float | None) -> None:
        self.counter = counter
        self.max_queries, self.price_per_1000, self.max_spend = max_queries, price_per_1000, max_spend
        self.used = 0
        """Billed queries, as the counter last said."""

    @property
    def spent(self) -> float:
        return spend(self.used, self.price_per_1000)

    @property
    def used_ratio(self) -> float:
        """The larger share of the query and money bounds used so far (0 with no bound)."""
        shares = [0.0]
        if self.max_queries:
            shares.append(self.used / self.max_queries)
        if self.max_spend:
            shares.append(self.spent / self.max_spend)
        return max(shares)

    def describe(self) -> str:
        bounds = []
        if self.max_queries is not None:
            bounds.append(f"{self.max_queries} queries")
        if self.max_spend is not None:
            bounds.append(f"{self.max_spend:g} spent at {self.price_per_1000:g} per 1000 queries")
        return " and ".join(bounds) or "no bound"

    async def load(self) -> None:
        """Read the counter (a restarted retriever continues the run's count)."""
        self.used = await self.counter.add(0)

    async def reserve(self) -> None:
        value = await self.counter.add(1)
        if not within_budget(value, self.max_queries, self.price_per_1000, self.max_spend):
            self.used = await self.counter.add(-1)
            raise BudgetExhausted(f"search budget spent: {self.used} billed queries of {self.describe()}")
        self.used = value

    async def release(self) -> None:
        self.used = await self.counter.add(-1)
