"""Learner settings: defaults follow Search-R1, env overrides, bounds, and the shipped configs validate."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from searchr1.core.settings import load_settings
from searchr1.learner.settings import LearnerSettings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_defaults_match_search_r1():
    s = LearnerSettings()
    a = s.algorithm
    assert (a.clip_low, a.entropy_coef, a.kl_loss_coef, a.kl_loss_type) == (0.2, 0.001, 0.001, "low_var_kl")
    assert (a.gamma, a.lam, a.value_clip, s.optim.grad_clip, s.optim.lr) == (1.0, 1.0, 0.5, 1.0, 1e-6)


def test_env_overrides_nested(monkeypatch):
    monkeypatch.setenv("LEARNER_OPTIM__LR", "3e-6")
    monkeypatch.setenv("LEARNER_ALGORITHM__MAX_STALENESS", "2")
    s = LearnerSettings()
    assert s.optim.lr == 3e-6 and s.algorithm.max_staleness == 2


def test_bounds_and_unknown_keys():
    with pytest.raises(ValidationError):
        LearnerSettings(algorithm={"clip_low": 1.5})
    with pytest.raises(ValidationError):
        LearnerSettings(algorithm={"kl_loss_type": "full"})
    with pytest.raises(ValidationError):
        LearnerSettings(batch={"groups_per_stpe": 3})
    with pytest.raises(ValidationError):
        LearnerSettings(algorithm={"entropy_coef": -1.5})
    assert LearnerSettings(algorithm={"entropy_coef": -0.02}).algorithm.entropy_coef == -0.02  # minimisation
    with pytest.raises(ValidationError, match="choose one"):
        LearnerSettings(algorithm={"advantage": "gae", "use_kl_loss": True, "kl_in_reward": True})


@pytest.mark.parametrize("name", ["learner-tiny-cpu.toml", "qwen2.5-3b-grpo.toml", "qwen2.5-7b-ppo.toml",
                                  "tiny-cpu.toml"])
def test_shipped_configs_validate(name):
    path = CONFIGS / name
    if not path.is_file():
        pytest.skip(f"{name} not present")
    s = load_settings(LearnerSettings, path)
    assert s.model.path


def test_search_r1_grpo_config_values():
    s = load_settings(LearnerSettings, CONFIGS / "qwen2.5-3b-grpo.toml")
    assert s.optim.lr == 1e-6 and s.optim.warmup_ratio == 0.285 and s.optim.total_steps == 1005
    assert s.batch.groups_per_step == 512 and s.batch.mini_batches == 2 and s.dispatcher.group_size == 5
    p = load_settings(LearnerSettings, CONFIGS / "qwen2.5-7b-ppo.toml")
    assert p.algorithm.advantage == "gae" and p.algorithm.kl_in_reward and p.optim.critic_lr == 1e-5
    assert p.optim.warmup_ratio == 0.95 and p.optim.critic_warmup_ratio == 0.05
