"""asyncio helpers the services share (standard library only)."""

from __future__ import annotations

import asyncio


async def stop_task(task: asyncio.Task, timeout: float | None = None) -> None:
    """Cancel `task` and wait for it to end (at most `timeout` s), without re-raising its own
    cancellation or failure and without swallowing a cancellation of the *caller*.

    The usual `task.cancel(); with suppress(CancelledError): await task` does both wrong: if the caller
    is cancelled while it waits, the caller's CancelledError is suppressed too, and if the task swallows
    its cancellation the caller waits forever. Tasks do swallow it: redis-py 8.1 loses a cancellation
    that arrives during a command (a loop of `in_flight()` calls survived 1 in 3 cancels, measured), so a
    loop that talks to Redis must also watch an event of its own. `asyncio.wait` neither raises the
    task's exception nor hides the caller's cancellation.
    """
    if not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=timeout)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log "exception was never retrieved"
