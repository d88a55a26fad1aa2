"""A service's link to Redis (docs/reliability.md, "Degraded dependencies"): whether Redis is answering,
for the service's readiness (`/readyz`), and the wait through an outage that every Redis call of the
learner and the rollout workers goes through.

`RedisLink.call(fn)` runs one Redis command (or pipeline) and, on an error worth another try (Redis
refused, reset, timed out or still loading its append-only file: `searchr1.core.retry.is_redis_transient`),
retries it with the one retry policy of `searchr1.core.retry` without a bound on the attempts; the
outage is logged once when it starts and once when it ends, with its length, and counted through the
callbacks. A command Redis refuses (`ResponseError`) is raised at once. `watch` PINGs once a second so
`up` follows Redis while the service makes no call. What a retried command may do twice, and how the
streams keep that harmless, is `searchr1.core.streams`'s part.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis import asyncio as aioredis

from searchr1.core.retry import is_redis_transient, retrying

R = TypeVar("R")

log = logging.getLogger("searchr1.core.redis_link")


class RedisLink:
    """One service's view of its Redis: whether Redis answered last (`up`, False until a first answer),
    how often it came back after being away (`reconnects`), and `call`, which runs one Redis command and
    waits for Redis through any outage (see the module docstring). The callbacks feed the service's
    metrics: `on_retry(exc)` before each wait, `on_reconnect()` when Redis answers again, `on_state(up)`
    on every change."""

    def __init__(self, name: str, *, backoff_s: float = 0.2, max_backoff_s: float = 5.0,
                 deadline_s: float | None = None, on_retry: Callable[[BaseException], None] | None = None,
                 on_reconnect: Callable[[], None] | None = None,
                 on_state: Callable[[bool], None] | None = None) -> None:
        if backoff_s <= 0 or max_backoff_s < backoff_s:
            raise ValueError("need 0 < backoff_s <= max_backoff_s")
        self.name = name
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.deadline_s = deadline_s
        self.on_retry = on_retry
        self.on_reconnect = on_reconnect
        self.on_state = on_state
        self.up = False
        self.reconnects = 0
        self.down_since: float | None = None

    def mark_down(self, exc: BaseException, what: str = "") -> None:
        """Redis did not answer (`exc`): not ready until it does."""
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("%s: redis unavailable%s (waiting for it): %s: %s", self.name,
                        f" at {what}" if what else "", type(exc).__name__, exc)
        was_up, self.up = self.up, False
        if was_up and self.on_state is not None:
            self.on_state(False)

    def mark_up(self) -> None:
        """Redis answered."""
        if self.up:
            return
        if self.down_since is not None:
            self.reconnects += 1
            log.warning("%s: redis back after %.1f s", self.name, time.monotonic() - self.down_since)
            self.down_since = None
            if self.on_reconnect is not None:
                self.on_reconnect()
        self.up = True
        if self.on_state is not None:
            self.on_state(True)

    async def call(self, fn: Callable[[], Awaitable[R]], what: str = "") -> R:
        """`await fn()` (one Redis command or pipeline), retried while Redis is unavailable."""

        def on_retry(exc: BaseException) -> None:
            self.mark_down(exc, what)
            if self.on_retry is not None:
                self.on_retry(exc)

        async for attempt in retrying(retries=None, backoff_s=self.backoff_s, max_backoff_s=self.max_backoff_s,
                                      deadline_s=self.deadline_s, retry_if=is_redis_transient,
                                      on_retry=on_retry):
            with attempt:
                result = await fn()
        self.mark_up()
        return result

    async def watch(self, redis: aioredis.Redis, stop: asyncio.Event, interval_s: float = 1.0,
                    timeout_s: float = 2.0) -> None:
        """PING every `interval_s` until `stop`, so `up` follows Redis while the service makes no call
        (a learner step, an idle worker between polls)."""
        while not stop.is_set():
            try:
                async with asyncio.timeout(timeout_s):
                    await redis.ping()
            except Exception as exc:  # noqa: BLE001 - any failed PING means not ready
                self.mark_down(exc, "ping")
            else:
                self.mark_up()
            try:
                async with asyncio.timeout(interval_s):
                    await stop.wait()
            except TimeoutError:
                pass
