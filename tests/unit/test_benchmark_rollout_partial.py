"""benchmarks/rollout_partial.py's figures, with hand-checked numbers (the benchmark itself needs a vLLM
engine and is run by `make bench`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rollout_partial  # noqa: E402


def test_idle_slot_seconds_integrates_the_empty_slots_over_the_window():
    # 4 slots; 2 running from t=1, 4 from t=2, 1 from t=4; window [0, 5]:
    # 0–1: 4 idle, 1–2: 2 idle, 2–4: 0 idle, 4–5: 3 idle → 4 + 2 + 0 + 3 = 9
    events = [(1.0, 2), (2.0, 4), (4.0, 1)]
    assert rollout_partial.idle_slot_seconds(events, 4, 0.0, 5.0) == pytest.approx(9.0)
    # the window cuts events outside it: [1.5, 3] → 0.5 × 2 + 1 × 0 = 1
    assert rollout_partial.idle_slot_seconds(events, 4, 1.5, 3.0) == pytest.approx(1.0)
    assert rollout_partial.idle_slot_seconds([], 8, 0.0, 2.0) == pytest.approx(16.0)


def test_the_workload_has_one_long_trajectory_in_every_n():
    assert rollout_partial.lengths(6, short=3, factor=10, every=3) == [30, 3, 3, 30, 3, 3]
