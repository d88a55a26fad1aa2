"""The learner's collapse-signal figures: hand-checked over real schema objects, exported as
`searchr1_learner_<signal>` gauges; every health alert links a runbook section that exists in docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from searchr1.core.schemas import Task, Trajectory, TrajectoryGroup
from searchr1.learner.algo.health import HEALTH_GAUGES, health_figures
from searchr1.learner.metrics import LearnerMetrics

ROOT = Path(__file__).resolve().parents[2]


def _traj(text: str, searches: int, finish: str) -> Trajectory:
    return Trajectory(prompt_ids=[1, 2], response_ids=[3, 4], loss_mask=[1, 1], behavior_logprobs=[-1.0, -1.0],
                      reward=0.0, num_searches=searches, finish_reason=finish, response_text=text)


def _group() -> TrajectoryGroup:
    good = "<think>a b</think><search>x</search><information>d</information><think>c</think><answer>y z</answer>"
    loop = "<think>a</think><search>x</search><information>d</information><think>b</think><search>X!</search>"
    return TrajectoryGroup(task=Task(task_id="t", question="q?", golden_answers=["y"], group_size=3),
                           policy_version=0, worker_id="w", sampling_temperature=1.0,
                           trajectories=[_traj(good, 1, "answer"), _traj(loop, 2, "length"), _traj("", 0, "eos")])


def test_health_figures_hand_checked():
    out = health_figures([_group()], {"loss": float("nan"), "grad_norm": float("inf"), "entropy": 1.0, "groups": 3})
    assert set(out) == set(HEALTH_GAUGES)
    assert out["malformed_rate"] == pytest.approx(2 / 3)  # the looping and the empty response
    assert out["repeated_query_rate"] == pytest.approx(1 / 3)  # x, x (normalized X!), x: 1 repeat of 3 queries
    assert out["truncated_rate"] == pytest.approx(1 / 3)
    assert out["answer_words_mean"] == pytest.approx(2 / 3)  # "y z", none, none
    assert out["think_words_mean"] == pytest.approx((3 + 2 + 0) / 3)
    assert out["nonfinite_figures"] == 2.0


def test_health_gauges_exported():
    m = LearnerMetrics()
    m.observe_step({"malformed_rate": 0.25, "nonfinite_figures": 1.0})
    text = generate_latest(m.registry).decode()
    assert "searchr1_learner_malformed_rate 0.25" in text and "searchr1_learner_nonfinite_figures 1.0" in text


def test_every_health_alert_is_documented_with_a_runbook_section():
    table = (ROOT / "docs/health.md").read_text()
    runbooks = {h.strip().lower() for h in re.findall(r"^## (.+)$", (ROOT / "docs/runbooks.md").read_text(), re.M)}
    rules = yaml.safe_load((ROOT / "deploy/prometheus/rules/searchr1.yml").read_text())
    health = [r for g in rules["groups"] if g["name"] == "searchr1-health" for r in g["rules"]]
    assert len(health) == 9  # the six collapse signals, WorkerOutOfSync, MismatchHigh, PublishedValuesFrozen
    for rule in health:
        name = rule["alert"]
        assert f"| {name} |" in table, name
        assert rule["annotations"]["runbook_url"] == \
            f"{{{{ $externalLabels.runbook_base }}}}/runbooks.md#{name.lower()}", name
        assert name.lower() in runbooks, name
