"""searchr1.core.supervise: a background task's death is a stop with its cause, never silence."""

from __future__ import annotations

import asyncio
import threading

import pytest

from searchr1.core.supervise import Supervisor, TaskDied


async def _forever() -> None:
    await asyncio.Event().wait()


async def _raise_after(s: float, exc: BaseException) -> None:
    await asyncio.sleep(s)
    raise exc


def test_a_raising_task_ends_wait_with_its_cause():
    async def main():
        sup = Supervisor("svc")
        sup.spawn("dispatcher", _raise_after(0.01, OSError(28, "No space left on device")))
        with pytest.raises(TaskDied) as info:
            await asyncio.wait_for(sup.wait(asyncio.Event()), 5)
        return info.value

    died = asyncio.run(main())
    assert died.task == "dispatcher" and isinstance(died.cause, OSError)
    assert "svc: background task 'dispatcher' died (OSError: [Errno 28] No space left on device)" in str(died)


def test_a_task_that_returns_is_a_death_unless_it_may_finish():
    async def main(may_finish: bool):
        sup = Supervisor("svc")
        sup.spawn("watch", asyncio.sleep(0.01), may_finish=may_finish)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        await asyncio.wait_for(sup.wait(stop), 5)

    asyncio.run(main(True))  # returned as allowed: the wait ends with the stop
    with pytest.raises(TaskDied, match="it returned while the service was running"):
        asyncio.run(main(False))


def test_run_stops_the_main_loop_through_its_event_and_raises():
    async def main():
        sup = Supervisor("learner")
        stop = asyncio.Event()
        ended = []

        async def loop():
            await stop.wait()  # a loop that watches its stop event
            ended.append("clean")
            return "state"

        sup.spawn("dispatcher", _raise_after(0.01, ValueError("bad row")))
        with pytest.raises(TaskDied, match="bad row"):
            await asyncio.wait_for(sup.run(loop(), stop), 5)
        assert stop.is_set() and ended == ["clean"]

    asyncio.run(main())


def test_run_cancels_a_main_loop_that_ignores_the_stop():
    async def main():
        sup = Supervisor("svc")
        sup.spawn("t", _raise_after(0.01, RuntimeError("x")))
        with pytest.raises(TaskDied):
            await asyncio.wait_for(sup.run(_forever(), asyncio.Event(), grace_s=0.05), 5)

    asyncio.run(main())


def test_run_returns_the_main_result_and_close_is_no_death():
    async def main():
        sup = Supervisor("svc")
        sup.spawn("watch", _forever())

        async def loop():
            await asyncio.sleep(0.01)
            return 7

        assert await sup.run(loop(), asyncio.Event()) == 7
        await sup.close()
        assert sup.failure is None
        sup.check()

    asyncio.run(main())


def test_a_cancel_from_outside_is_a_death_and_the_main_loop_failure_comes_first():
    async def main():
        sup = Supervisor("svc")
        t = sup.spawn("watch", _forever())
        await asyncio.sleep(0)
        t.cancel()
        await asyncio.sleep(0.01)
        with pytest.raises(TaskDied, match="CancelledError"):
            sup.check()

        sup2 = Supervisor("svc")

        async def loop():
            raise KeyError("the loop's own")

        with pytest.raises(KeyError):
            await sup2.run(loop(), asyncio.Event())

    asyncio.run(main())


def test_a_thread_reports_a_death():
    async def main():
        sup = Supervisor("svc")
        sup.bind()
        th = threading.Thread(target=sup.fail, args=("metrics", OSError("select failed")))
        th.start()
        th.join()
        with pytest.raises(TaskDied, match="'metrics' died \\(OSError: select failed\\)"):
            await asyncio.wait_for(sup.wait(asyncio.Event()), 5)

    asyncio.run(main())
