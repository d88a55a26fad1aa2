"""`stop_task`: ends a background task without hanging on one that ignores its cancellation and without
swallowing the caller's own cancellation (the pattern it replaced did both)."""

from __future__ import annotations

import asyncio
import time

import pytest

from searchr1.core.aio import stop_task


async def _stubborn(started: asyncio.Event, release: asyncio.Event) -> None:
    """Loses its cancellations, as a loop around redis-py commands can (core.aio.stop_task)."""
    started.set()
    while not release.is_set():
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            continue


async def test_a_task_that_ignores_cancel_is_waited_for_at_most_timeout():
    started, release = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(_stubborn(started, release))
    await started.wait()
    t0 = time.monotonic()
    await stop_task(task, timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 2.0
    assert not task.done()
    release.set()
    await task


async def test_the_callers_cancellation_is_not_swallowed():
    started, release = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(_stubborn(started, release))
    await started.wait()
    caller = asyncio.create_task(stop_task(task))  # no timeout: waits until cancelled
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert caller.cancelled()
    release.set()
    await task


async def test_the_tasks_own_failure_or_cancellation_is_not_raised():
    async def fails():
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails())
    await asyncio.wait({failed})
    await stop_task(failed)  # already done with an error: retrieved, not raised

    sleeper = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    await stop_task(sleeper)
    assert sleeper.cancelled()
