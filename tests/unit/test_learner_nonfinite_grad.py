"""A NaN that reaches the optimizer: the update is skipped and counted, the weights and the optimizer
state stay as they were, and the next good batch trains. On a tiny random Qwen2."""

from __future__ import annotations

import math
import random

import pytest
import torch

from searchr1.learner.algo.batch import build_batch
from searchr1.learner.algo.poison import group_problem
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.build import build_training
from searchr1.learner.train.model import DistInfo
from tests.support.synthetic import synthetic_group, tiny_qwen2

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("m") / "tiny", vocab=128, hidden=64)


def _groups(rewards):
    """Groups with these rewards; a NaN is set after validation (the wire schema refuses one: this is
    what gets past it, e.g. a NaN made inside the learner)."""
    rng = random.Random(3)
    out = []
    for i, r in enumerate(rewards):
        g = synthetic_group(f"g{i}", group_size=4, vocab=128, rewards=[0.0 if math.isnan(x) else x for x in r],
                            rng=rng)
        trajs = [t.model_copy(update={"reward": x}) for t, x in zip(g.trajectories, r)]
        out.append(g.model_copy(update={"trajectories": trajs}))
    return out


def test_a_nan_gradient_skips_the_update_and_is_counted(model_path):
    s = LearnerSettings(model={"path": str(model_path)}, device="cpu", optim={"lr": 1e-2},
                        algorithm={"advantage": "grpo", "use_kl_loss": False}, batch={"micro_batch_size": 16})
    training = build_training(s, DistInfo())
    trainer = training.trainer
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    poisoned = _groups([[1.0, 0.0, math.nan, 0.0], [1.0, 0.0, 0.0, 1.0]])
    trainer.train_step(build_batch(poisoned, pad_id=training.pad_id), 0)
    assert trainer.nonfinite_skips >= 1
    for k, v in trainer.policy.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed by a skipped update"
    assert not trainer.optimizer.state, "a skipped update leaves the optimizer state untouched"
    trainer.train_step(build_batch(_groups([[1.0, 0.0, 0.0, 1.0]]), pad_id=training.pad_id), 0)
    changed = any(not torch.equal(v, before[k]) for k, v in trainer.policy.state_dict().items())
    assert changed and all(torch.isfinite(v).all() for v in trainer.policy.state_dict().values())


def test_group_problem_names_the_first_poison_and_passes_a_clean_group():
    (clean,) = _groups([[1.0, 0.0, 0.0, 1.0]])
    assert group_problem(clean, 128) is None
    assert group_problem(clean, 10) is not None and "outside the vocabulary [0, 10)" in group_problem(clean, 10)
    nan = clean.model_copy(update={"trajectories": [clean.trajectories[0].model_copy(update={"reward": math.nan})]})
    assert group_problem(nan, 128) == "trajectory 0: reward nan"
    t = clean.trajectories[0].model_copy(update={"prompt_ids": [-1, 2]})
    bad = clean.model_copy(update={"trajectories": [t]})
    assert group_problem(bad, None) == "trajectory 0: token id -1 outside the vocabulary [0, None)"
