"""`benchmarks/weight_sync_report.py`: the 7B model scales the largest size's per-GB medians, wall and CPU,
split into the learner's publish and each worker's share (hand-checked at 15.23 GB)."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.weight_sync_report import model_7b, summary


def _row(write: float, verify: float, cpu_write: float, cpu_verify: float, size="0.5b", gb=1.0):
    seconds = {"write": write, "verify": verify, "reload": 0.1}
    cpu = {"write": cpu_write, "verify": cpu_verify, "reload": 0.1}
    return SimpleNamespace(size=size, variant="after", transport="volume", bytes=int(gb * 1e9),
                           seconds=seconds, cpu=cpu, total=sum(seconds.values()), load=1.5)


def test_the_7b_row_scales_the_median_rates_of_the_largest_size():
    rows = [_row(1.0, 0.5, 0.8, 0.4), _row(3.0, 0.7, 0.9, 0.6), _row(0.2, 0.3, 0.7, 0.2),
            _row(9.0, 9.0, 9.0, 9.0, size="tiny", gb=0.01)]
    line = model_7b(rows).splitlines()[-1]
    # medians per GB: write 1.0 / CPU 0.8, verify 0.5 / CPU 0.4, reload 0.1 / 0.1; × 15.231 GB
    assert "| 15.2 (12.2) | 9.1 (7.6) | 24.4 (19.8) (goal ≤ 10) |" in line, line
    assert line.startswith("| after | volume | 1.000 | 0.000 | 0.000 | 0.000 | 0.500 | 0.100 | 1.30 |"), line


def test_a_path_within_the_goal_is_not_flagged():
    line = model_7b([_row(0.2, 0.2, 0.1, 0.1)]).splitlines()[-1]
    assert line.endswith("| 3.0 (1.5) | 4.6 (3.0) | 7.6 (4.6) |"), line  # (0.2 + 0.3) s/GB × 15.231


def test_the_summary_gives_median_and_range_per_phase():
    line = summary([_row(1.0, 0.5, 0.8, 0.4), _row(3.0, 0.7, 0.9, 0.6), _row(0.2, 0.3, 0.7, 0.2)]).splitlines()[-1]
    assert "| 0.5b | after | volume | 3 | 1.00 (0.20–3.00) |" in line and "| 1.60 (0.60–3.80) |" in line, line
