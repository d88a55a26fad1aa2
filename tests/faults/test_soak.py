"""The soak in the fault tier (`make test-faults`): ten minutes of configs/soak.toml's faults — kill -9 of any
service including Redis, partitions, slow links, and the liveness faults (poison tasks, reward outages, a bad
dataset row, disk-full windows, slow checkpoints, Redis data loss, idle-connection floods); across network
namespaces when run as root — then the audit (nothing lost, nothing trained twice), no silent stall, and
training going on after the last fault. RSS slopes are
reported; ten minutes leave no process the `rss_min_fit_s` of samples past warm-up that a slope is judged
on (`make soak` judges them). `SOAK_DURATION_S` and `SOAK_SEED` change the length and the schedule."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.faults.soak import Soak, SoakSettings
from tests.faults.soak_report import summary_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.faults
@pytest.mark.timeout(3600)
def test_soak(tmp_path):
    settings = SoakSettings.load(ROOT / "configs" / "soak.toml")
    settings.duration_s = float(os.environ.get("SOAK_DURATION_S", "600"))
    settings.seed = int(os.environ.get("SOAK_SEED", "0"))
    soak = Soak(settings, tmp_path / "soak", ROOT / "configs" / "soak.toml")
    try:
        code = soak.run()
    finally:
        soak.close()
    report = json.loads((tmp_path / "soak" / "soak.json").read_text())
    print(summary_text(report))
    assert code == 0 and report["ok"], report["problems"]
    assert report["audit"]["lost"] == 0 and report["audit"]["trained_twice"] == 0
    assert report["stalls"]["silent"] == [], report["stalls"]
    injected = [f for f in report["faults"] if "skipped" not in f]
    assert len(injected) >= settings.duration_s / (settings.fault_interval_s + settings.fault_jitter_s) - 1
    assert all(f["next_step_after_s"] is not None for f in injected), "a fault after which no step came"
    assert (tmp_path / "soak" / "soak.png").stat().st_size > 0
