"""The Search-R1 paper configs (configs/searchr1-*.toml) agree with Search-R1 v0.2's hyperparameters and
launch as their own [placement] table places them. (That every config under configs/ validates table by
table is tests/unit/test_deploy.py's `test_run_configs_load`.)"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

from searchr1.core.settings import load_settings
from searchr1.launcher.placement import plan_placement
from searchr1.launcher.planner import build_plan
from tests.support.configs import SETTINGS

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PAPER = sorted(CONFIGS.glob("searchr1-*.toml"))


def _load(cls_path: tuple[str, str], config: Path, monkeypatch: pytest.MonkeyPatch):
    cls = getattr(importlib.import_module(cls_path[0]), cls_path[1])
    for key in [k for k in os.environ if k.startswith(cls.model_config["env_prefix"])]:
        monkeypatch.delenv(key)
    return load_settings(cls, config)


def test_paper_configs_exist():
    assert [p.stem for p in PAPER] == sorted(f"searchr1-{size}{it}-{algo}" for size in ("3b", "7b")
                                             for it in ("", "-instruct") for algo in ("grpo", "ppo"))


@pytest.mark.parametrize("config", PAPER, ids=lambda p: p.stem)
def test_paper_config_matches_search_r1_v02(config: Path, monkeypatch: pytest.MonkeyPatch):
    learner = _load(SETTINGS["learner"], config, monkeypatch)
    rollout = _load(SETTINGS["rollout"], config, monkeypatch)
    size, instruct, algo = config.stem.split("-")[1], "-instruct-" in config.stem, config.stem.split("-")[-1]
    model = f"models/Qwen2.5-{size.upper()}{'-Instruct' if instruct else ''}"
    assert learner.model.path == rollout.model == model
    assert (learner.optim.lr, learner.optim.warmup_ratio, learner.optim.total_steps) == (1e-6, 0.285, 1005)
    assert (learner.batch.groups_per_step, learner.batch.mini_batches) == (512, 2)
    assert learner.dispatcher.dataset == "data/nq_hotpotqa_train/train.parquet" and learner.dispatcher.epochs == 15
    assert (rollout.agent.max_turns, rollout.agent.max_tokens_per_turn, rollout.agent.max_obs_tokens) == (4, 500, 500)
    assert rollout.retriever.top_k == 3 and rollout.reward.scorer == "searchr1_em"
    if algo == "grpo":
        assert learner.algorithm.advantage == "grpo" and learner.dispatcher.group_size == 5
        assert (learner.algorithm.use_kl_loss, learner.algorithm.kl_loss_coef,
                learner.algorithm.kl_loss_type) == (True, 0.001, "low_var_kl")
    else:
        assert learner.algorithm.advantage == "gae" and learner.dispatcher.group_size == 1
        assert (learner.optim.critic_lr, learner.optim.critic_warmup_ratio) == (1e-5, 0.015)
        assert (learner.algorithm.kl_in_reward, learner.algorithm.kl_coef) == (True, 0.001)
        assert learner.dispatcher.top_p == 1.0


@pytest.mark.parametrize("config", PAPER, ids=lambda p: p.stem)
def test_paper_config_launches_as_its_placement(config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    placement = plan_placement(_load(SETTINGS["placement"], config, monkeypatch))
    launcher = _load(SETTINGS["launcher"], config, monkeypatch)
    rollout = _load(SETTINGS["rollout"], config, monkeypatch)
    retriever = _load(SETTINGS["retriever"], config, monkeypatch)
    learner = _load(SETTINGS["learner"], config, monkeypatch)
    # the placement alone places the processes: no hand-written GPU env, worker count or learner command
    assert "CUDA_VISIBLE_DEVICES" not in {**launcher.rollout.env, **launcher.learner.env, **launcher.retriever.env}
    assert "workers" not in launcher.rollout.model_fields_set and "learner" not in launcher.commands
    plan = build_plan(launcher, config, tmp_path / "run")
    assert plan.placement == placement
    specs = {s.name: s for s in plan.specs}
    assert [n for n in specs if n.startswith("rollout-")] == [w.name for w in placement.rollout]
    for name, where in placement.by_name().items():
        assert where.env.items() <= specs[name].env.items(), name
    # torchrun (searchr1.learner.torchrun on the launcher's interpreter) with the placement's arguments, and
    # the launcher's grace, less torchrun's own exit, for the ranks to finish their step
    prefix = placement.learner.command_prefix
    assert prefix[:3] == ("python", "-m", "searchr1.learner.torchrun")
    assert specs["learner"].argv[:len(prefix) + 2] == [sys.executable, *prefix[1:], "-m", "searchr1.cli"]
    assert int(specs["learner"].env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) == int(launcher.grace_period_s) - 10
    assert not [p for p in plan.problems if "placement" in p]
    # the services' own tables agree with what the placement sets through their env
    env = placement.rollout[0].env
    assert str(rollout.engine.tensor_parallel_size) == env["ROLLOUT_ENGINE__TENSOR_PARALLEL_SIZE"]
    assert str(rollout.engine.gpu_memory_utilization) == env["ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION"]
    assert retriever.search.device == placement.retriever.env["RETRIEVER_SEARCH__DEVICE"]
    assert learner.device == placement.learner.env["LEARNER_DEVICE"]
    # each FSDP rank takes an equal share of a step's groups
    assert learner.batch.groups_per_step % len(placement.learner.gpus) == 0
