"""The collapse guard's decision: out-of-bounds figures, patience, bounded rollbacks, the healthy checkpoint."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from searchr1.learner.guard import CollapseGuard, GuardPolicy, GuardSettings, breaches, healthy_checkpoint
from searchr1.learner.settings import LearnerSettings


def test_breaches_above_below_and_non_finite():
    above, below = {"malformed_rate": 0.8, "kl_loss": 1.0}, {"reward_mean": 0.1}
    assert breaches({"malformed_rate": 0.5, "kl_loss": 0.2, "reward_mean": 0.3}, above, below) == []
    assert breaches({"malformed_rate": 0.9, "reward_mean": 0.05}, above, below) == \
        ["malformed_rate 0.9 > 0.8", "reward_mean 0.05 < 0.1"]
    assert breaches({"kl_loss": float("nan")}, above, below) == ["kl_loss nan > 1"]
    assert breaches({"kl_loss": "x"}, above, below) == []  # not a number: ignored


def test_policy_patience_resets_and_bounded_rollbacks():
    p = GuardPolicy(GuardSettings(enabled=True, above={"x": 1.0}, patience=2, max_rollbacks=1))
    bad, good = {"x": 2.0}, {"x": 0.0}
    assert p.observe(1, bad).action == "continue"
    assert p.observe(2, good).action == "continue"  # a single bad step is noise: the streak resets
    assert p.observe(3, bad).action == "continue"
    d = p.observe(4, bad)
    assert (d.action, d.first_bad_step, d.reasons) == ("rollback", 3, ("x 2 > 1",))
    assert p.observe(5, bad).action == "continue"
    d = p.observe(6, bad)
    assert (d.action, d.first_bad_step) == ("stop", 5)
    assert p.unhealthy == {1, 3, 4, 5, 6}


def test_healthy_checkpoint_is_the_newest_complete_one_before_the_streak(tmp_path):
    for step, complete in ((1, True), (2, True), (3, False), (4, True), (6, True)):
        d = tmp_path / f"step{step:08d}"
        d.mkdir()
        if complete:
            (d / "state.json").write_text("{}")
    (tmp_path / ".tmp-step00000007").mkdir()
    # a streak from step 5: step 5's figures describe checkpoint 4's weights, so 4 is out too; 3 never finished
    assert healthy_checkpoint(tmp_path, 5).name == "step00000002"
    assert healthy_checkpoint(tmp_path, 8).name == "step00000006"
    assert healthy_checkpoint(tmp_path, 8, unhealthy={7}).name == "step00000004"  # 6 is described by step 7
    assert healthy_checkpoint(tmp_path, 8, unhealthy={5}).name == "step00000006"
    assert healthy_checkpoint(tmp_path, 2) is None
    assert healthy_checkpoint(tmp_path / "none", 9) is None


def test_guard_is_off_by_default_and_validated():
    assert LearnerSettings().guard.enabled is False
    with pytest.raises(ValueError):
        GuardSettings(lr_factor=1.5)
    with pytest.raises(ValueError):
        GuardSettings(typo=1)


def test_guard_decides_and_names_the_checkpoint_without_a_learner(tmp_path):
    """The guard returns decisions the loop carries out: a rollback names its healthy checkpoint, a rollback
    with none kept becomes a stop with its message; it counts nothing it did not do."""
    for step in (1, 2):
        (tmp_path / f"step{step:08d}").mkdir()
        (tmp_path / f"step{step:08d}" / "state.json").write_text("{}")
    registry = CollectorRegistry()
    guard = CollapseGuard(GuardSettings(enabled=True, above={"x": 1.0}, patience=1, max_rollbacks=2), tmp_path,
                          registry)
    assert guard.judge(3, {"x": 0.0}).action == "continue"
    d = guard.judge(4, {"x": 2.0})
    assert (d.action, d.checkpoint) == ("rollback", tmp_path / "step00000002")
    assert registry.get_sample_value("searchr1_learner_guard_rollbacks_total") == 0.0  # not carried out yet
    event = guard.rolled_back(d, lr=0.5, version=5)
    assert (event["checkpoint"], event["version"]) == ("step00000002", 5)
    assert registry.get_sample_value("searchr1_learner_guard_rollbacks_total") == 1.0
    d = guard.judge(2, {"x": 2.0})  # a streak from step 2: no checkpoint below step 1 is kept
    assert d.action == "stop" and d.checkpoint is None and "checkpoint.keep must exceed" in d.message
    assert registry.get_sample_value("searchr1_learner_guard_stopped") == 1.0
