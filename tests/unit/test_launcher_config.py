"""configs/tiny-cpu.toml and its no-cost control: every service table validates against that service's
settings class, so `searchr1 up` never starts a service that stops at once on an unknown key (reconcile the
configs when a service's settings change); the variant differs from the demo only where it says it does."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from searchr1.core.settings import load_settings, read_config_file

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CONFIG = CONFIGS / "tiny-cpu.toml"
NO_COST = CONFIGS / "tiny-cpu-no-cost.toml"


@pytest.mark.parametrize("module, cls", [
    ("searchr1.launcher.settings", "LauncherSettings"),
    ("searchr1.retriever.settings", "RetrieverSettings"),
    ("searchr1.reward.settings", "RewardSettings"),
    ("searchr1.rollout.settings", "RolloutSettings"),
    ("searchr1.learner.settings", "LearnerSettings"),
])
@pytest.mark.parametrize("config", [CONFIG, NO_COST], ids=lambda p: p.stem)
def test_table_matches_settings_class(module, cls, config, monkeypatch):
    settings_cls = getattr(importlib.import_module(module), cls)
    assert settings_cls.section in read_config_file(config)
    for key in [k for k in os.environ if k.startswith(settings_cls.model_config["env_prefix"])]:
        monkeypatch.delenv(key)
    load_settings(settings_cls, config)  # raises on an unknown key or a bad value


def test_no_cost_control_differs_only_in_its_reward_and_run():
    demo, control = read_config_file(CONFIG), read_config_file(NO_COST)
    reward = demo["rollout"].pop("reward")
    assert reward["scorer"] == "composite" and reward["item_format"] == "prompt_response"
    components = {c.get("name", c["scorer"]): c for c in reward["params"]["components"]}
    assert components["search_cost"]["params"]["cost_per_search"] > 0
    # the control keeps the demo's accuracy + format reward and drops only the cost
    assert control["rollout"].pop("reward") == components["searchr1_em_format"]
    assert control["launcher"].pop("run") != demo["launcher"].pop("run")
    for table in (demo, control):
        table["launcher"].pop("run_dir")
        for section in ("weights", "checkpoint"):
            table["learner"][section].pop("dir")
    assert control == demo


def test_process_tables_share_env_and_extra_args(tmp_path, monkeypatch):
    from pydantic import ValidationError

    from searchr1.launcher.settings import LauncherSettings

    for key in [k for k in os.environ if k.startswith("LAUNCHER_")]:
        monkeypatch.delenv(key)
    path = tmp_path / "run.toml"
    path.write_text("[launcher.retriever]\nenv = { A = '1' }\nextra_args = ['--x']\nhealth_timeout_s = 5\n"
                    "[launcher.reward]\nenv = { B = '{run_dir}' }\n"
                    "[launcher.rollout]\nextra_args = ['--y', '2']\n[launcher.learner]\nhealth_timeout_s = 7\n")
    s = load_settings(LauncherSettings, path)
    assert (s.retriever.env, s.retriever.extra_args, s.retriever.health_timeout_s) == ({"A": "1"}, ["--x"], 5)
    assert s.reward.env == {"B": "{run_dir}"} and s.reward.extra_args == [] and s.reward.health_timeout_s == 60
    assert s.rollout.extra_args == ["--y", "2"] and s.rollout.health_timeout_s == 600
    assert s.learner.env == {} and s.learner.health_timeout_s == 7
    path.write_text("[launcher.reward]\nhealth_timeout_s = 5000\n")  # each process keeps its own bound
    with pytest.raises(ValidationError, match="health_timeout_s"):
        load_settings(LauncherSettings, path)
    path.write_text("[launcher.reward]\nextra_arg = ['--x']\n")
    with pytest.raises(ValidationError, match="extra_arg"):
        load_settings(LauncherSettings, path)
