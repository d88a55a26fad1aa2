"""A service's link to Redis (docs/reliability.md, "Degraded dependencies"): whether Redis is answering,
for the service's readiness (`/readyz`), and the wait through an outage that every Redis call of the
learner and the rollout workers goes through.

`RedisLink.call(fn)` runs one Redis command (or pipeline) and, on an error worth another try (Redis
refused, reset, timed out or still loading its append-only file: `searchr1.core.retry.is_redis_transient`),
retries it with the one retry policy of `searchr1.core.retry` without a bound on the attempts; the
outage is logged once when it starts and once when it ends, with its length, and counted through the
callbacks. Refusals that say Redis cannot take writes for now rather than that the command is wrong
(`refusal_kind`: `oom` past `maxmemory` with `noeviction`, `misconf` when it cannot persist,
`readonly` on a replica after a failover, `masterdown`) are waited through the same way: the service
turns not-ready, logs an error naming the cause once per episode, counts it (`on_refusal(kind)`) and
retries, instead of crashing into a restart loop that cannot fix Redis. Any other refused command
(`ResponseError`: wrong type, no such group…) is raised at once. `watch` PINGs once a second so
`up` follows Redis while the service makes no call. What a retried command may do twice, and how the
streams keep that harmless, is `searchr1.streams.delivery`'s part.

`Call` is the shape of `RedisLink.call` that the streams' writers take (`direct`, without a link: one
try, errors to the caller).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis import asyncio as aioredis
from redis.exceptions import MasterDownError, OutOfMemoryError, ReadOnlyError, ResponseError

from searchr1.core.retry import is_redis_transient, retrying
from searchr1.core.settings import REDIS_REPLY_TIMEOUT_S

R = TypeVar("R")

log = logging.getLogger("searchr1.streams.link")

Call = Callable[[Callable[[], Awaitable[Any]], str], Awaitable[Any]]
"""How a stream runs one Redis command: `RedisLink.call` (waits through outages) or `direct`."""


async def direct(fn: Callable[[], Awaitable[R]], what: str = "") -> R:
    """Run one Redis command once (no link: errors reach the caller)."""
    return await fn()

_REFUSALS = {"OOM": "oom", "MISCONF": "misconf", "READONLY": "readonly", "MASTERDOWN": "masterdown"}
_IN_PIPELINE = "of pipeline caused error: "
"""How redis-py prefixes the error of a command in a pipeline (`Command # n (…) of pipeline caused error:`)."""


def refusal_kind(exc: BaseException) -> str | None:
    """`oom`, `misconf`, `readonly` or `masterdown` for a refusal that says Redis cannot take the command
    for now (see the module docstring); None for anything else."""
    if isinstance(exc, OutOfMemoryError):  # redis-py strips the code from the message of these
        return "oom"
    if isinstance(exc, ReadOnlyError):
        return "readonly"
    if isinstance(exc, MasterDownError):
        return "masterdown"
    if not isinstance(exc, ResponseError):
        return None
    text = str(exc)
    if _IN_PIPELINE in text:  # redis-py names the pipeline's command first: the reply's code follows
        text = text.split(_IN_PIPELINE, 1)[1].lstrip("('\" ")
    head = text.split(" ", 1)[0].upper()
    return _REFUSALS.get(head)


def is_redis_waitable(exc: BaseException) -> bool:
    """Whether `RedisLink.call` waits and retries: Redis away (`is_redis_transient`) or refusing for now."""
    return is_redis_transient(exc) or refusal_kind(exc) is not None

MEMORY_WARN_FRACTION = 0.8
"""Past this share of Redis's `maxmemory`, `watch` logs a warning (the alert fires at the same share)."""


class RedisLink:
    """One service's view of its Redis: whether Redis answered last (`up`, False until a first answer),
    how often it came back after being away (`reconnects`), and `call`, which runs one Redis command and
    waits for Redis through any outage (see the module docstring). The callbacks feed the service's
    metrics: `on_retry(exc)` before each wait, `on_reconnect()` when Redis answers again, `on_state(up)`
    on every change, `on_memory(used_bytes, maxmemory_bytes)` from `watch` (maxmemory 0: no limit)."""

    def __init__(self, name: str, *, backoff_s: float = 0.2, max_backoff_s: float = 5.0,
                 deadline_s: float | None = None, on_retry: Callable[[BaseException], None] | None = None,
                 on_reconnect: Callable[[], None] | None = None,
                 on_state: Callable[[bool], None] | None = None,
                 on_memory: Callable[[int, int], None] | None = None,
                 on_refusal: Callable[[str], None] | None = None) -> None:
        if backoff_s <= 0 or max_backoff_s < backoff_s:
            raise ValueError("need 0 < backoff_s <= max_backoff_s")
        self.name = name
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.deadline_s = deadline_s
        self.on_retry = on_retry
        self.on_reconnect = on_reconnect
        self.on_state = on_state
        self.on_memory = on_memory
        self.on_refusal = on_refusal
        self._memory_at = float("-inf")
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
            kind = refusal_kind(exc)
            if kind is not None:
                if self.down_since is None:
                    log.error("%s: redis refuses writes (%s)%s: %s; not ready, waiting for it", self.name, kind,
                              f" at {what}" if what else "", exc)
                if self.on_refusal is not None:
                    self.on_refusal(kind)
            self.mark_down(exc, what)
            if self.on_retry is not None:
                self.on_retry(exc)

        async for attempt in retrying(retries=None, backoff_s=self.backoff_s, max_backoff_s=self.max_backoff_s,
                                      deadline_s=self.deadline_s, retry_if=is_redis_waitable,
                                      on_retry=on_retry):
            with attempt:
                result = await fn()
        self.mark_up()
        return result

    async def watch(self, redis: aioredis.Redis, stop: asyncio.Event, interval_s: float = 1.0,
                    timeout_s: float = 2.0, memory_interval_s: float = 15.0) -> None:
        """PING every `interval_s` until `stop`, so `up` follows Redis while the service makes no call
        (a learner step, an idle worker between polls); every `memory_interval_s`, read Redis's memory
        use for `on_memory` (and log a warning past 80 % of `maxmemory`)."""
        while not stop.is_set():
            try:
                async with asyncio.timeout(timeout_s):
                    await redis.ping()
                    await self._sample_memory(redis, memory_interval_s)
            except Exception as exc:  # noqa: BLE001 - any failed PING means not ready
                self.mark_down(exc, "ping")
            else:
                self.mark_up()
            try:
                async with asyncio.timeout(interval_s):
                    await stop.wait()
            except TimeoutError:
                pass

    async def _sample_memory(self, redis: aioredis.Redis, every_s: float) -> None:
        now = time.monotonic()
        if self.on_memory is None or now - self._memory_at < every_s:
            return
        self._memory_at = now
        info = await redis.info("memory")
        used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        if limit and used > MEMORY_WARN_FRACTION * limit:
            log.warning("%s: redis uses %.0f MiB of its maxmemory %.0f MiB: writes fail at the limit "
                        "(noeviction); check that consumers ack and streams are trimmed", self.name,
                        used / 2**20, limit / 2**20)
        self.on_memory(used, limit)


SOCKET_TIMEOUT_S = REDIS_REPLY_TIMEOUT_S
"""How long a Redis reply may take before the call fails as a timeout (and `RedisLink` waits and retries):
a black-holed connection (a partition that drops packets without a reset) hangs no caller longer. The
settings refuse blocking reads (`block_ms`) of half of it or more (`searchr1.core.settings.check_block_ms`)."""


def _keepalive_options() -> dict[int, int]:
    opts = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}  # a dead peer found in about 25 s
    return {getattr(socket, name): value for name, value in opts.items() if hasattr(socket, name)}


def connect(url: str, *, socket_timeout_s: float = SOCKET_TIMEOUT_S) -> aioredis.Redis:
    """An asyncio Redis client (bytes responses) that never waits forever: connect and reply timeouts,
    TCP keepalive, and a PING before reusing a connection idle for 10 s."""
    return aioredis.Redis.from_url(url, decode_responses=False, socket_timeout=socket_timeout_s,
                                   socket_connect_timeout=min(socket_timeout_s, 10.0), socket_keepalive=True,
                                   socket_keepalive_options=_keepalive_options(), health_check_interval=10)
