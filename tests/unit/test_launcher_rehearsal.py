"""The rehearsal's swap (`launcher/rehearsal.py`): the list of keys it may change is the one below — growing it
means changing this test —, any other difference is refused, every shipped run config can be rehearsed, and
configs that differ only in what the swap replaces share one rehearsal."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchr1.core.settings import read_config_file
from searchr1.launcher.rehearsal import (
    ADDED_TABLES,
    SWAPS,
    RehearsalError,
    StandIns,
    check_swaps,
    rehearsal_config,
    same_rehearsal,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted([*ROOT.glob("configs/searchr1-*.toml"), *ROOT.glob("configs/qwen2.5-*.toml")])
STAND_INS = StandIns(model=Path("/m"), dataset=Path("/w/train.parquet"), corpus=Path("/w/corpus.jsonl"),
                     index_dir=Path("/w/index-bm25"))

THE_LIST = {
    "rollout.model", "learner.model.path", "learner.model.critic_path", "rollout.engine.max_model_len",
    "learner.dispatcher.dataset", "launcher.retriever.index_dir", "launcher.retriever.kind",
    "launcher.retriever.corpus", "launcher.retriever.health_timeout_s", "retriever.search", "placement",
    "launcher.commands.learner", "launcher.rollout.workers", "launcher.rollout.env",
    "rollout.engine.gpu_memory_utilization", "rollout.engine.enforce_eager", "rollout.engine.tensor_parallel_size",
    "learner.device", "learner.threads", "retriever.torch_threads", "retriever.faiss_threads", "reward.workers",
    "learner.batch.groups_per_step", "learner.dispatcher.max_inflight", "launcher.run", "launcher.run_dir",
    "launcher.learner.extra_args",
}


def _rehearse(path: Path) -> dict:
    services = read_config_file(ROOT / "configs/searchr1-3b-grpo.toml")
    return rehearsal_config(read_config_file(path), STAND_INS, name=path.stem, run_dir=Path("/r") / path.stem,
                            steps=3, services=services)


def test_the_swap_list_is_the_one_reviewed():
    assert set(SWAPS) == THE_LIST
    assert ADDED_TABLES == ("launcher", "rollout", "retriever", "reward")
    assert all(reason.split(":")[0] in ("model", "data", "index", "devices", "compute", "run")
               for reason in SWAPS.values())


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_rehearses_as_configured(path):
    shipped = read_config_file(path)
    rehearsed = _rehearse(path)
    diffs = check_swaps(shipped, rehearsed)
    changed = {d.key for d in diffs}
    learner = shipped["learner"]
    # what the recipe is made of stays as written
    for key in ("model.dtype", "optim.lr", "optim.warmup_ratio", "optim.total_steps", "batch.mini_batches",
                "batch.micro_batch_size", "checkpoint.every", "dispatcher.group_size", "algorithm"):
        assert not any(k.startswith(f"learner.{key}") for k in changed), key
    assert rehearsed["learner"]["model"]["dtype"] == learner["model"]["dtype"]
    assert rehearsed["learner"]["optim"] == learner["optim"]
    assert rehearsed["learner"]["algorithm"] == learner["algorithm"]
    assert rehearsed["launcher"]["learner"]["extra_args"] == ["--max-steps", "3"]
    assert "placement" not in rehearsed


def test_a_difference_no_swap_covers_is_refused():
    shipped = read_config_file(ROOT / "configs/searchr1-3b-grpo.toml")
    rehearsed = _rehearse(ROOT / "configs/searchr1-3b-grpo.toml")
    rehearsed["learner"]["optim"]["lr"] = 1e-4  # the demo's rate
    with pytest.raises(RehearsalError, match="learner.optim.lr"):
        check_swaps(shipped, rehearsed)
    rehearsed = _rehearse(ROOT / "configs/searchr1-3b-grpo.toml")
    rehearsed["rollout"]["engine"]["dtype"] = "float32"
    with pytest.raises(RehearsalError, match="rollout.engine.dtype"):
        check_swaps(shipped, rehearsed)


def test_a_learner_only_config_gets_the_other_services_and_only_them():
    path = ROOT / "configs/qwen2.5-3b-grpo.toml"
    shipped = read_config_file(path)
    assert "rollout" not in shipped
    diffs = check_swaps(shipped, _rehearse(path))
    added = {d.key.split(".")[0] for d in diffs if d.shipped is None and d.reason.startswith("a learner-only")}
    assert added <= set(ADDED_TABLES) and "rollout" in added


def test_configs_that_differ_only_in_the_swapped_model_share_a_rehearsal():
    digests = {p.name: same_rehearsal(_rehearse(p)) for p in SHIPPED}
    assert digests["searchr1-3b-grpo.toml"] == digests["searchr1-7b-instruct-grpo.toml"]
    assert digests["searchr1-3b-grpo.toml"] != digests["searchr1-3b-ppo.toml"]
    assert digests["qwen2.5-3b-grpo.toml"] != digests["qwen2.5-3b-grpo-ema-pg.toml"]
