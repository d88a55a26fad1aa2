"""The one retry policy of the service clients (retriever gRPC client, reward HTTP client, LLM judge):
bounded attempts, exponential backoff with jitter, an optional deadline over all attempts, and a retry
only on errors a second try can fix.

Transient: gRPC UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED; HTTP connection errors and
timeouts (`httpx.TransportError`); HTTP 429 and 5xx (raised by the caller as `TransientHTTPStatus`).
Everything else — INVALID_ARGUMENT, auth errors, other 4xx, a malformed answer — fails at once.
For Redis (`is_redis_transient`, used by `searchr1.streams.RedisLink`): a connection refused or
reset, a timeout, and a server still loading its data (BUSYLOADING, after a restart from its AOF).
The services wait for Redis without a bound on the attempts (`retries=None`): a run outlives a Redis
restart instead of crashing over it.

Backoff: before retry n (n = 1, 2, …) the policy waits `backoff_s · 2^(n-1)` at most and half of that at
least ("equal jitter": half fixed, half uniform random), capped at `max_backoff_s`; replicas restarting
together are not hit in lock-step, and no wait is longer than a plain doubling backoff's.

Owns the policy, not the calls: the clients run their own request inside tenacity's attempt loop:

    async for attempt in retrying(retries=3, backoff_s=0.1, max_backoff_s=2.0):
        with attempt:
            response = await call()
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import httpx
from redis import exceptions as redis_exceptions
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    stop_never,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.stop import stop_base

TRANSIENT_GRPC_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.RESOURCE_EXHAUSTED})
"""gRPC status codes worth another try (on another replica when there is one)."""


class TransientHTTPStatus(Exception):
    """An HTTP answer worth another try (429 or 5xx); raise it inside an attempt to have it retried."""

    def __init__(self, response: httpx.Response, detail: str = "") -> None:
        super().__init__(f"HTTP {response.status_code}{': ' + detail if detail else ''}")
        self.response = response


def is_transient_http_status(status_code: int) -> bool:
    """429 (rate limited) and 5xx are worth another try; any other 4xx is the request's fault."""
    return status_code == 429 or status_code >= 500


def is_transient(exc: BaseException) -> bool:
    """Whether a failed attempt is worth another (see the module docstring)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in TRANSIENT_GRPC_CODES
    return isinstance(exc, httpx.TransportError | TransientHTTPStatus)


def is_redis_transient(exc: BaseException) -> bool:
    """Whether a failed Redis call is worth another: Redis unreachable (refused, reset, timed out) or
    still loading its data set (`BusyLoadingError` is a `ConnectionError`). A command Redis refused
    (`ResponseError`: wrong type, no such group…) is not."""
    return isinstance(exc, redis_exceptions.ConnectionError | redis_exceptions.TimeoutError | OSError)


def retrying(
    *,
    retries: int | None,
    backoff_s: float,
    max_backoff_s: float,
    deadline_s: float | None = None,
    retry_if: Callable[[BaseException], bool] = is_transient,
    before_sleep: Callable[[RetryCallState], None] | None = None,
    on_retry: Callable[[BaseException], None] | None = None,
) -> AsyncRetrying:
    """An async attempt loop: at most `retries + 1` attempts (None: no bound), retrying the exceptions `retry_if` accepts
    after an equal-jitter exponential backoff from `backoff_s`; with `deadline_s`, no retry starts whose
    backoff would end past `deadline_s` from the first attempt. The last exception is re-raised as is.
    `on_retry(exc)` (or tenacity's `before_sleep(state)`) is called before each backoff."""
    if on_retry is not None:
        if before_sleep is not None:
            raise ValueError("give on_retry or before_sleep, not both")

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            if exc is not None:
                on_retry(exc)

    if (retries is not None and retries < 0) or backoff_s < 0 or max_backoff_s < 0:
        raise ValueError("retries, backoff_s and max_backoff_s must be >= 0")
    stop: stop_base = stop_never if retries is None else stop_after_attempt(retries + 1)
    if deadline_s is not None:
        stop = stop | stop_before_delay(deadline_s)
    half, cap = backoff_s / 2, max_backoff_s / 2
    wait = wait_exponential(multiplier=half, max=cap) + wait_random_exponential(multiplier=half, max=cap)
    return AsyncRetrying(stop=stop, wait=wait, retry=retry_if_exception(retry_if), reraise=True,
                         before_sleep=before_sleep)
