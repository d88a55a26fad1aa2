"""The desync rule (`learner/algo/desync.py`) on hand-checked numbers: a worker far beyond its peers is
flagged, a fleet-wide shift is not, a lone worker is judged against the floor, thin evidence is not judged."""

from __future__ import annotations

import dataclasses

import pytest

from searchr1.learner.algo.desync import DesyncPolicy, WorkerMismatch
from searchr1.learner.settings import DesyncSettings


def _policy(**desync) -> DesyncPolicy:
    return DesyncPolicy.from_settings(DesyncSettings(**desync))


def _w(mean: float, tokens: int = 100) -> WorkerMismatch:
    return WorkerMismatch(tokens=tokens, abs_diff=mean * tokens, groups=1)


def test_a_worker_far_beyond_its_peers_is_flagged():
    policy = _policy(abs_threshold=0.05, ratio=10.0, min_tokens=16)
    d = policy.decide({"a": _w(0.01), "b": _w(0.012), "c": _w(0.3)})
    assert list(d.flagged) == ["c"]
    assert "27.3× its peers' median 0.011" in d.flagged["c"]  # 0.3 / median(0.01, 0.012) = 0.3 / 0.011
    assert d.figures == pytest.approx({"a": 0.01, "b": 0.012, "c": 0.3})


def test_a_fleet_wide_shift_flags_nobody():
    policy = _policy(abs_threshold=0.05, ratio=10.0)
    assert not policy.decide({"a": _w(0.2), "b": _w(0.25), "c": _w(0.3)}).any  # every worker in bf16, say


def test_below_the_floor_nobody_is_flagged_however_far_from_the_peers():
    policy = _policy(abs_threshold=0.05, ratio=10.0)
    assert not policy.decide({"a": _w(1e-6), "b": _w(0.04)}).any


def test_a_lone_worker_is_judged_against_the_floor():
    policy = _policy(abs_threshold=0.05)
    assert "no peer in the step" in policy.decide({"a": _w(0.2)}).flagged["a"]
    assert not policy.decide({"a": _w(0.04)}).any


def test_too_few_tokens_are_not_judged():
    policy = _policy(abs_threshold=0.05, min_tokens=16)
    assert not policy.decide({"a": _w(0.01), "b": _w(5.0, tokens=15)}).any
    assert policy.decide({"a": _w(0.01), "b": _w(5.0, tokens=16)}).flagged.keys() == {"b"}


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="abs_threshold > 0"):
        dataclasses.replace(_policy(), abs_threshold=0.0)
    with pytest.raises(ValueError):
        dataclasses.replace(_policy(), ratio=0.5)
