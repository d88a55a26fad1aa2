"""Background tasks that cannot die unseen: a `Supervisor` owns the tasks a service runs beside its main
loop (a dispatcher, a Redis watch, a heartbeat, an HTTP server's serve task, a batcher's loop) and turns
the death of any of them into the service's stop, with the cause.

A supervised task dies when it raises, or when it returns while the service is not stopping and it was
not started as one that may finish (`may_finish`: a dispatcher that published its last epoch). Its death
is logged once, with the task's name and the exception, and recorded as `TaskDied`; then

- `wait(stop)` (a server whose main coroutine only waits for a signal) raises it;
- `run(main, stop)` (a service with a main loop) sets `stop`, so a loop that watches its stop event ends
  at its next check (never in the middle of a checkpoint or an ack), gives it `grace_s`, cancels it if it
  is still running, and raises it;
- `check()` raises it (a loop that looks between passes).

The service's command turns `TaskDied` into a non-zero exit with the message (`searchr1.core.commandline`),
so its supervisor (`searchr1 up`, Kubernetes) restarts it, instead of a process that answers its probes
while the work it exists for has stopped. A thread may report a death too (`fail`, thread-safe: the
metrics server's serve thread).

What it does not do: restart a task in place. A task that can ride out its own failures (a heartbeat that
logs a failed beat and beats again) does so inside its loop; what escapes the loop is a death.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from searchr1.core.aio import stop_task

log = logging.getLogger("searchr1.core.supervise")

T = TypeVar("T")


class TaskDied(RuntimeError):
    """A supervised background task of `service` died: raised (or returned) `cause` (None: it returned
    while it should have run on)."""

    def __init__(self, service: str, task: str, cause: BaseException | None) -> None:
        self.service = service
        self.task = task
        self.cause = cause
        why = (f"{type(cause).__name__}: {cause}" if cause is not None
               else "it returned while the service was running")
        super().__init__(f"{service}: background task {task!r} died ({why}); stopping the service")


class Supervisor:
    """The supervised background tasks of one service (see the module docstring)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.failure: TaskDied | None = None
        """The first death (None while every task lives or ended as allowed)."""
        self.stopping = False
        """Set by `close`: a task cancelled or ending from now on is no death."""
        self._tasks: dict[asyncio.Task[Any], tuple[str, bool]] = {}
        self._owned: set[asyncio.Task[Any]] = set()
        self._failed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ tasks

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any], *, may_finish: bool = False) -> asyncio.Task[Any]:
        """Run `coro` as a supervised task named `name`; `may_finish`: returning is allowed (raising is not)."""
        task = self.watch(name, asyncio.create_task(coro, name=name), may_finish=may_finish)
        self._owned.add(task)
        return task

    def watch(self, name: str, task: asyncio.Task[Any], *, may_finish: bool = False) -> asyncio.Task[Any]:
        """Supervise a task started and stopped elsewhere (an HTTP server's serve task): stop the supervisor
        (`close`) before stopping it."""
        self._loop = asyncio.get_running_loop()
        self._tasks[task] = (name, may_finish)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        name, may_finish = self._tasks.pop(task, ("?", False))
        self._owned.discard(task)
        if task.cancelled():
            if not self.stopping:
                self._record(name, asyncio.CancelledError("cancelled from outside the service's stop"))
            return
        exc = task.exception()
        if exc is not None:
            self._record(name, exc)
        elif not may_finish and not self.stopping:
            self._record(name, None)

    def fail(self, name: str, cause: BaseException | None) -> None:
        """Record the death of `name` (a thread's, say); safe to call from any thread."""
        loop = self._loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            self._record(name, cause)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the service is gone already
            loop.call_soon_threadsafe(self._record, name, cause)

    def bind(self) -> None:
        """Remember the running loop (so `fail` from a thread reaches it before any task is spawned)."""
        self._loop = asyncio.get_running_loop()

    def _record(self, name: str, cause: BaseException | None) -> None:
        if self.stopping or self.failure is not None:
            if cause is not None and not self.stopping:
                log.error("%s: background task %r also died: %s: %s", self.service, name,
                          type(cause).__name__, cause)
            return
        self.failure = TaskDied(self.service, name, cause)
        log.critical("%s", self.failure, exc_info=(type(cause), cause, cause.__traceback__)
                     if cause is not None else None)
        self._failed.set()

    # ------------------------------------------------------------------ the service's side

    def check(self) -> None:
        """Raise the first death, if any."""
        if self.failure is not None:
            raise self.failure

    async def wait(self, stop: asyncio.Event) -> None:
        """Until `stop` is set; raises `TaskDied` when a supervised task dies first."""
        self.bind()
        stopped = asyncio.ensure_future(stop.wait())
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            failed.cancel()
        self.check()

    async def run(self, main: Awaitable[T], stop: asyncio.Event, *, grace_s: float = 60.0) -> T:
        """Run `main` (a loop that ends once `stop` is set) while watching the tasks: on a death, `stop`
        is set, `main` gets `grace_s` to end, is cancelled after that, and `TaskDied` is raised."""
        self.bind()
        main_task = asyncio.ensure_future(main)
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait({main_task, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
        if main_task.done():
            result = main_task.result()  # the loop's own failure first: it is the cause
            self.check()
            return result
        stop.set()
        done, _ = await asyncio.wait({main_task}, timeout=grace_s)
        if not done:
            log.error("%s: the main loop did not end within %.0f s of the stop: cancelling it", self.service,
                      grace_s)
            await stop_task(main_task, timeout=grace_s)
        elif not main_task.cancelled() and main_task.exception() is not None:
            log.error("%s: the main loop failed while stopping: %s", self.service, main_task.exception())
        self.check()
        raise AssertionError("unreachable")  # pragma: no cover - check() raised

    async def close(self, timeout: float = 10.0) -> None:
        """Stop every task `spawn` started that still runs; the end of any supervised task is no death from
        here on (the owner of a watched task stops it after this)."""
        self.stopping = True
        for task in list(self._owned):
            await stop_task(task, timeout=timeout)
