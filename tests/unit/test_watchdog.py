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
