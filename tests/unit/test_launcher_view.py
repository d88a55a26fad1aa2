"""The live view's pure parts: the ETA, the plain-console progress text, the step pace; the progress bar's
total from the run config; and that a non-terminal console gets no live display."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from searchr1.launcher.specs import total_steps
from searchr1.launcher.view import LiveView, StepPace, eta_s, progress_text


def test_eta_is_the_steps_left_at_the_measured_pace():
    assert eta_s(10, 150, 2.0) == 280.0
    assert eta_s(150, 150, 2.0) == 0.0
    assert eta_s(160, 150, 2.0) == 0.0
    assert eta_s(0, 150, 2.0) is None
    assert eta_s(10, 150, None) is None
    assert eta_s(10, 150, 0.0) is None


def test_progress_text():
    assert progress_text(12, 150, 2.5) == "step 12/150 (8%) · ETA 5:45"
    assert progress_text(12, 150, None) == "step 12/150 (8%)"
    assert progress_text(1, 3, 2000.0) == "step 1/3 (33%) · ETA 1:06:40"
    assert progress_text(None, 150, 2.0) == ""
    assert progress_text(3, None, 2.0) == ""


def test_step_pace_is_timed_from_the_first_step_change():
    pace = StepPace()
    pace.observe(None, now=0.0)
    pace.observe(0, now=100.0)
    pace.observe(0, now=104.0)
    pace.observe(1, now=230.0)  # the wait for the first step (start-up, first rollout) does not count
    assert pace.seconds_per_step is None
    pace.observe(1, now=233.0)
    pace.observe(3, now=240.0)
    assert pace.seconds_per_step == 5.0
    pace.observe(5, now=250.0)
    assert pace.seconds_per_step == 5.0
    pace.observe(0, now=300.0)  # a restart
    assert pace.seconds_per_step is None
    pace.observe(1, now=310.0)
    pace.observe(2, now=314.0)
    assert pace.seconds_per_step == 4.0


def test_live_view_draws_nothing_off_a_terminal():
    buf = io.StringIO()
    view = LiveView(Console(file=buf, force_terminal=False), "[4/6] train", 150)
    view.start()
    view.phase("starting rollout-0")
    view.update(0, "step 0 · reward –")
    view.pace.observe(4, now=1e12)
    assert not view.active
    view.stop()
    assert buf.getvalue() == ""
    assert view.plain_progress(None) == ""


def test_live_view_on_a_terminal_shows_stage_bar_and_status():
    buf = io.StringIO()
    view = LiveView(Console(file=buf, force_terminal=True, width=140), "[4/6] train", 150)
    view.start()
    assert view.active
    view.phase("training")
    view.update(15, "step 15 · reward 0.300")
    view.stop()
    out = buf.getvalue()
    assert "[4/6] train · training" in out and "15/150" in out and "step 15 · reward 0.300" in out


@pytest.mark.parametrize(("text", "expected"), [
    ("[learner.optim]\ntotal_steps = 150\n", 150),
    ("[learner.optim]\nlr = 1e-4\n", None),
    ("[learner]\noptim = 3\n", None),
    ("[learner.optim]\ntotal_steps = true\n", None),
    ("[learner.optim]\ntotal_steps = 0\n", None),
    ("", None),
])
def test_total_steps_from_the_run_config(tmp_path, text, expected):
    cfg = tmp_path / "run.toml"
    cfg.write_text(text)
    assert total_steps(cfg) == expected


def test_total_steps_of_a_missing_or_broken_config(tmp_path):
    assert total_steps(tmp_path / "missing.toml") is None
    (tmp_path / "bad.toml").write_text("[learner\n")
    assert total_steps(tmp_path / "bad.toml") is None


def test_plain_cadence_prints_every_share_of_the_run_whatever_its_pace():
    from searchr1.launcher.view import PlainCadence

    cadence = PlainCadence(interval_s=15.0, every_percent=5.0, total_steps=100)
    # one snapshot a second for 400 s, one step every 2 s: 5% (5 steps) apart, not every 15 s
    printed = [t for t in range(400) if cadence.due(t / 2 if t < 200 else 100.0, float(t))]
    steps = [t / 2 for t in printed]
    assert steps == [0.0] + [5.0 * k for k in range(1, 21)]


def test_plain_cadence_falls_back_to_time_without_a_step_total():
    from searchr1.launcher.view import PlainCadence

    cadence = PlainCadence(interval_s=15.0, every_percent=5.0, total_steps=None)
    assert [t for t in range(0, 50) if cadence.due(float(t), float(t))] == [0, 15, 30, 45]
    by_time = PlainCadence(interval_s=10.0, every_percent=0.0, total_steps=100)
    assert [t for t in range(0, 35) if by_time.due(None, float(t))] == [0, 10, 20, 30]
