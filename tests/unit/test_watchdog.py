"""The liveness watchdog against a hand-stepped clock: alive while beats come within the bound, not alive
past it, alive again after a beat, and excused (alive, bound restarted) while a dependency is away or
inside a wait another watchdog bounds."""

from __future__ import annotations

import pytest

from searchr1.core.watchdog import Watchdog


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_stall_bound_and_excuse():
    clock, away = Clock(), [False]
    dog = Watchdog("w", 10.0, excused=lambda: away[0], clock=clock)
    clock.t = 9.9
    assert dog.alive()
    clock.t = 10.0
    assert not dog.alive()
    dog.beat()
    clock.t = 19.9
    assert dog.alive()
    away[0] = True
    clock.t = 100.0
    assert dog.alive()  # waiting on an outage is not a stall
    away[0] = False
    clock.t = 109.9
    assert dog.alive()  # the bound restarts when the outage ends
    clock.t = 110.0
    assert not dog.alive()


def test_bound_must_be_positive():
    with pytest.raises(ValueError):
        Watchdog("w", 0)


def test_a_wait_another_watchdog_bounds_is_no_stall():
    clock = Clock()
    dog = Watchdog("w", 10.0, clock=clock)
    with dog.waiting():
        clock.t = 100.0
        assert dog.alive()  # a rank waiting for rank 0's next step
    clock.t = 109.9
    assert dog.alive()  # the wait's end is a beat
    clock.t = 110.0
    assert not dog.alive()
    with pytest.raises(RuntimeError), dog.waiting():
        raise RuntimeError("the wait failed")
    clock.t = 200.0
    assert not dog.alive()  # no wait is left open by a failure


def test_a_stage_that_keeps_writing_is_progress_one_that_stopped_is_not():
    # a checkpoint measured by the bytes it has written: every look (at most once a second) beats while
    # the count grows, and the bound runs from the last growth once it stops
    clock, written = Clock(), [0]
    dog = Watchdog("learner", 10.0, clock=clock)
    with dog.progressing(lambda: written[0]):
        for t in range(5, 60, 5):  # 55 s of a slow save, 5 s between looks, growing each time
            clock.t = float(t)
            written[0] += 1_000_000
            assert dog.alive(), t
        clock.t = 64.9  # stopped growing at t=55: alive until the bound from the last growth
        assert dog.alive()
        clock.t = 65.0
        assert not dog.alive()
    clock.t = 70.0
    dog.beat()
    written[0] += 1
    clock.t = 79.9
    assert dog.alive()
    clock.t = 80.0
    assert not dog.alive()  # the stage's end leaves no measure behind: growth no longer counts


def test_a_measure_is_read_at_most_once_per_interval_and_its_errors_are_no_progress():
    clock, reads = Clock(), []

    def measure() -> int:
        reads.append(clock.t)
        if clock.t >= 3.0:
            raise OSError("the directory went away")
        return int(clock.t * 10)

    dog = Watchdog("learner", 100.0, clock=clock)
    with dog.progressing(measure, every_s=1.0):
        for t in (0.2, 0.5, 0.9, 1.0, 1.5, 2.5, 3.5):
            clock.t = t
            dog.alive()
    assert reads == [0.0, 1.0, 2.5, 3.5]


def test_the_guard_stops_with_what_the_service_was_doing():
    import asyncio

    from searchr1.core.watchdog import Stalled

    clock = Clock()
    dog = Watchdog("learner", 10.0, clock=clock,
                   describe=lambda: "waiting for groups of step 13: 1 of 2 read; 0 tasks in flight")

    async def main():
        task = asyncio.create_task(dog.guard(every_s=0.01))
        await asyncio.sleep(0.05)
        assert not task.done()
        clock.t = 1800.0
        with pytest.raises(Stalled) as info:
            await asyncio.wait_for(task, 5)
        return str(info.value)

    assert asyncio.run(main()) == ("learner: no progress for 1800 s (stall_timeout_s 10): waiting for groups of "
                                   "step 13: 1 of 2 read; 0 tasks in flight")
