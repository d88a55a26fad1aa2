"""The shared retry policy: attempt bound, equal-jitter backoff bounds (hand-checked), the deadline, and
which errors count as transient."""

from __future__ import annotations

import grpc
import httpx
import pytest

from searchr1.core.retry import TransientHTTPStatus, is_transient, is_transient_http_status, retrying


class FakeRpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="x")


async def _run(policy, fail: int, exc: Exception) -> int:
    calls = 0
    async for attempt in policy:
        with attempt:
            calls += 1
            if calls <= fail:
                raise exc
    return calls


async def test_backoff_bounds_and_attempt_limit():
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    policy = retrying(retries=3, backoff_s=0.1, max_backoff_s=2.0)
    policy.sleep = sleep
    assert await _run(policy, 3, httpx.ConnectError("down")) == 4
    # before retry n: between half of and all of 0.1 · 2^(n-1)
    for s, hi in zip(sleeps, [0.1, 0.2, 0.4], strict=True):
        assert hi / 2 <= s <= hi
    policy = retrying(retries=2, backoff_s=0.0, max_backoff_s=2.0)
    with pytest.raises(httpx.ConnectError):
        await _run(policy, 5, httpx.ConnectError("down"))
    assert policy.statistics["attempt_number"] == 3


async def test_cap_and_deadline():
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    policy = retrying(retries=6, backoff_s=1.0, max_backoff_s=4.0)
    policy.sleep = sleep
    await _run(policy, 6, httpx.ReadTimeout("slow"))
    assert all(s <= 4.0 for s in sleeps) and sleeps[-1] >= 2.0
    policy = retrying(retries=50, backoff_s=10.0, max_backoff_s=2.0, deadline_s=1.0)  # the first backoff (≥ 5 s) ends too late
    with pytest.raises(httpx.ReadTimeout):
        await _run(policy, 50, httpx.ReadTimeout("slow"))
    assert policy.statistics["attempt_number"] == 1


async def test_permanent_errors_are_not_retried():
    policy = retrying(retries=3, backoff_s=0.0, max_backoff_s=2.0)
    with pytest.raises(FakeRpcError):
        await _run(policy, 1, FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT))
    assert policy.statistics["attempt_number"] == 1
    with pytest.raises(ValueError, match="retries"):
        retrying(retries=-1, backoff_s=0.1, max_backoff_s=2.0)


def test_transient_classification():
    assert is_transient(FakeRpcError(grpc.StatusCode.UNAVAILABLE))
    assert is_transient(FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert is_transient(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED))
    assert not is_transient(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT))
    assert not is_transient(FakeRpcError(grpc.StatusCode.UNAUTHENTICATED))
    assert is_transient(httpx.ConnectError("x")) and is_transient(httpx.ReadTimeout("x"))
    assert is_transient(TransientHTTPStatus(httpx.Response(503)))
    assert not is_transient(ValueError("x"))
    assert [c for c in (200, 400, 401, 404, 422, 429, 500, 502, 503) if is_transient_http_status(c)] == [429, 500,
                                                                                                          502, 503]


async def test_on_retry_sees_each_retried_exception():
    seen: list[BaseException] = []
    calls = 0
    async for attempt in retrying(retries=3, backoff_s=0.0, max_backoff_s=2.0, on_retry=seen.append):
        with attempt:
            calls += 1
            if calls < 3:
                raise httpx.ConnectError(f"down {calls}")
    assert calls == 3 and [str(e) for e in seen] == ["down 1", "down 2"]
    with pytest.raises(ValueError, match="not both"):
        retrying(retries=1, backoff_s=0.0, max_backoff_s=2.0, on_retry=seen.append, before_sleep=lambda s: None)
