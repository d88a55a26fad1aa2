"""The restart rule (`searchr1.launcher.restarts`) against hand-computed back-offs and budgets, and the
restart policy in the launch plan (`specs.py`)."""

from __future__ import annotations

import random

import pytest

from searchr1.launcher.planner import build_plan
from searchr1.launcher.restarts import RestartRule, backoff_s
from searchr1.launcher.settings import LauncherSettings, RestartSettings


def test_backoff_doubles_caps_and_adds_bounded_jitter():
    rng = random.Random(0)
    assert [backoff_s(n, 1.0, 30.0, 0.0, rng) for n in (1, 2, 3, 5, 6, 100)] == [1.0, 2.0, 4.0, 16.0, 30.0, 30.0]
    waits = [backoff_s(2, 1.0, 30.0, 0.5, rng) for _ in range(200)]
    assert all(2.0 <= w <= 2.5 for w in waits) and max(waits) - min(waits) > 0.3
    with pytest.raises(ValueError):
        backoff_s(0, 1.0, 30.0, 0.0, rng)


def test_budget_counts_within_the_sliding_window():
    rule = RestartRule.from_settings(RestartSettings(max_restarts=2, window_s=10.0, backoff_initial_s=1.0,
                                                     jitter_s=0.0))
    assert rule.next_restart(0.0) == (1, 1.0)
    assert rule.next_restart(5.0) == (2, 2.0)
    assert rule.next_restart(9.0) is None  # third death within 10 s: given up
    assert rule.next_restart(10.5) == (2, 2.0)  # the death at 0 left the window; the one at 5 did not
    assert rule.total == 3


def test_settings_refuse_a_cap_below_the_first_wait():
    with pytest.raises(ValueError, match="backoff_max_s"):
        RestartSettings(backoff_initial_s=10.0, backoff_max_s=1.0)


def test_plan_gives_every_long_running_process_the_default_policy_unless_it_says_never(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text("[launcher]\n")
    s = LauncherSettings(retriever={"index_dir": str(tmp_path / "missing"), "corpus": str(cfg)},
                         rollout={"workers": 2}, learner={"restart": "never"},
                         restart={"max_restarts": 7})
    plan = build_plan(s, cfg, tmp_path / "run")
    by_name = {p.name: p for p in plan.specs}
    assert by_name["index-build"].restart is None  # one-shot
    assert by_name["learner"].restart is None  # its own `never`
    for name in ("redis", "retriever", "reward", "rollout-0", "rollout-1"):
        assert by_name[name].restart is not None and by_name[name].restart.max_restarts == 7, name
    never = build_plan(LauncherSettings(restart={"policy": "never"}, reward={"restart": "on-failure"},
                                        retriever={"index_dir": str(tmp_path)}), cfg, tmp_path / "run")
    assert [p.name for p in never.specs if p.restart is not None] == ["reward"]


def test_redis_keeps_an_append_only_file_in_the_run_directory(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text("[launcher]\n")
    redis = build_plan(LauncherSettings(retriever={"index_dir": str(tmp_path)}), cfg, tmp_path / "run").specs[0]
    argv = redis.argv
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--appendfsync") + 1] == "always"
    assert argv[argv.index("--dir") + 1] == str((tmp_path / "run" / "redis").resolve())
    relaxed = build_plan(LauncherSettings(retriever={"index_dir": str(tmp_path)}, redis={"appendfsync": "everysec"}),
                         cfg, tmp_path / "run").specs[0]
    assert relaxed.argv[relaxed.argv.index("--appendfsync") + 1] == "everysec"
