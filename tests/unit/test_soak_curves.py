"""The soak's figures (tests/faults/soak_curves.py) against hand-checked numbers."""

from __future__ import annotations

import pytest

from tests.faults.soak_curves import (
    MIB,
    RssSample,
    next_step_after,
    percentile,
    pooled_slope,
    rss_slopes,
    slope,
)


def test_percentile_interpolates_between_ranks():
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 99) == pytest.approx(49.6)  # 40 + 0.96 × 10
    assert percentile([3, 1, 2], 100) == 3


def test_next_step_after_is_the_first_step_strictly_later():
    steps = [1.0, 5.0, 9.0]
    assert next_step_after(5.0, steps) == 4.0
    assert next_step_after(0.5, steps) == 0.5
    assert next_step_after(9.0, steps) is None


def test_slope_of_a_line_and_of_too_few_points():
    assert slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    assert slope([(0, 1), (1, 3)]) is None
    assert slope([(1, 1), (1, 2), (1, 3)]) is None


def test_pooled_slope_ignores_the_drop_at_a_restart():
    """Two incarnations, each flat after warm-up, the second lower: a fit over all samples would see a
    falling line; within each incarnation RSS is flat, so the slope is 0."""
    first = [RssSample(t, "w", 1, 500 * MIB) for t in range(0, 100, 10)]
    second = [RssSample(t, "w", 2, 300 * MIB) for t in range(100, 200, 10)]
    per_s, used = pooled_slope(first + second, warmup_s=0)
    assert per_s == pytest.approx(0.0)
    assert used == 180  # 90 s of each


def test_pooled_slope_sees_growth_within_incarnations_and_skips_warmup():
    """1 MiB per 10 s within each incarnation (360 MiB/h), each starting with a 200 MiB jump in its first
    20 s (warm-up, left out); a restart resets RSS."""
    samples = []
    for pid, start in ((1, 0), (2, 300)):
        for k in range(30):
            t = start + 10 * k
            rss = (100 if k < 2 else 300 + k) * MIB
            samples.append(RssSample(t, "learner", pid, rss))
    per_s, _ = pooled_slope(samples, warmup_s=20)
    assert per_s * 3600 / MIB == pytest.approx(360.0)
    figures = rss_slopes(samples, warmup_s=20)["learner"]
    assert figures["slope_mib_per_h"] == pytest.approx(360.0)
    assert figures["incarnations"] == 2 and figures["peak_mib"] == pytest.approx(329.0)


def test_an_incarnation_shorter_than_its_warmup_does_not_count():
    samples = [RssSample(t, "r", 1, (100 + t) * MIB) for t in range(0, 30, 10)]
    assert pooled_slope(samples, warmup_s=60) == (None, 0.0)


def test_an_rss_slope_is_judged_only_when_fitted_long_enough():
    from tests.faults.soak import SoakSettings
    from tests.faults.soak_report import problems_of

    settings = SoakSettings(rss_slope_bound_mib_per_h=64.0, rss_min_fit_s=600.0)
    audit = {"lost": 0, "trained_twice": 0, "ok": True}
    short = {"learner": {"slope_mib_per_h": 267.9, "fitted_s": 120.0}}
    long = {"learner": {"slope_mib_per_h": 267.9, "fitted_s": 600.0}}
    within = {"learner": {"slope_mib_per_h": 63.9, "fitted_s": 3000.0}}
    assert problems_of(settings, audit, short, None) == []  # two minutes: reported, not judged
    assert problems_of(settings, audit, long, None) == ["RSS of learner grows 267.9 MiB/h (bound 64)"]
    assert problems_of(settings, audit, within, None) == []
    harness = {"soak": {"slope_mib_per_h": 231.4, "fitted_s": 2100.0}}  # the harness's own record: not judged
    assert problems_of(settings, audit, harness, None) == []


def test_silent_stalls_are_long_gaps_without_a_signal():
    from tests.faults.soak_curves import silent_stalls

    steps = [10.0, 20.0, 30.0, 400.0, 410.0, 900.0]
    # two gaps past a bound of 100 s: 30 → 400 and 410 → 900, and the end (900 → 950) is short
    assert silent_stalls(steps, 0.0, 950.0, 100.0, []) == [(30.0, 400.0), (410.0, 900.0)]
    # a signal inside the first gap leaves no silent stretch longer than the bound in it
    assert silent_stalls(steps, 0.0, 950.0, 100.0, [(100.0, 105.0), (200.0, 300.0)]) == [(410.0, 900.0)]
    # a restart early in a long wait does not excuse the rest of it
    assert silent_stalls(steps, 0.0, 950.0, 100.0, [(100.0, 110.0), (420.0, 430.0)]) == [
        (110.0, 400.0), (430.0, 900.0)]
    # signals every 90 s all along: loud throughout
    assert silent_stalls(steps, 0.0, 950.0, 100.0, [(t, t + 1.0) for t in range(30, 900, 90)]) == []
    # a run that never steps after its start, and the open end after the last step
    assert silent_stalls([], 0.0, 250.0, 100.0, [(120.0, 121.0)]) == [(0.0, 120.0), (121.0, 250.0)]
    assert silent_stalls([10.0], 0.0, 500.0, 100.0, []) == [(10.0, 500.0)]
