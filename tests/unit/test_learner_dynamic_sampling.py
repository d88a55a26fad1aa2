"""DAPO's group filters: dynamic sampling drops groups whose GRPO advantages are all zero, overlong
filtering masks the loss of length-truncated responses."""

from __future__ import annotations

import torch

from searchr1.learner.algo.advantages import outcome_advantages
from searchr1.learner.algo.batch import build_batch
from searchr1.learner.algo.group_filters import is_flat, mask_overlong, split_flat_groups
from tests.support.synthetic import synthetic_group


def test_flat_groups_are_those_with_all_zero_advantages():
    groups = [
        synthetic_group("mixed", rewards=[1.0, 0.0, 0.0, 1.0]),
        synthetic_group("solved", rewards=[1.0, 1.0, 1.0, 1.0]),
        synthetic_group("failed", rewards=[0.0, 0.0, 0.0, 0.0]),
        synthetic_group("partial", rewards=[0.5, 0.5, 0.5, 0.25]),
        synthetic_group("lone-zero", group_size=1, rewards=[0.0]),
        synthetic_group("lone-one", group_size=1, rewards=[1.0]),
    ]
    split = split_flat_groups(groups)
    assert [g.task.task_id for g in split.informative] == ["mixed", "partial", "lone-one"]
    assert [g.task.task_id for g in split.flat] == ["solved", "failed", "lone-zero"]
    assert (split.all_solved, split.all_failed) == (1, 2)
    # the definition agrees with the advantages the trainer computes
    for g in groups:
        adv = outcome_advantages(build_batch([g]), "grpo").advantages
        assert is_flat(g) == bool((adv == 0).all())


def test_mask_overlong_zeroes_the_loss_of_truncated_responses_only():
    g = synthetic_group("g", rewards=[1.0, 0.0, 1.0, 0.0])
    cut = g.trajectories[1].model_copy(update={"finish_reason": "length"})
    g = g.model_copy(update={"trajectories": [g.trajectories[0], cut, *g.trajectories[2:]]})
    other = synthetic_group("h")
    out, n = mask_overlong([g, other])
    assert n == 1 and out[1] is other
    t = out[0].trajectories
    assert sum(t[1].loss_mask) == 0 and set(t[1].behavior_logprobs) == {0.0}
    assert [x.reward for x in t] == [1.0, 0.0, 1.0, 0.0]  # the group's statistics are unchanged
    assert t[0] == g.trajectories[0] and t[2] == g.trajectories[2]
    batch = build_batch(out[:1])
    assert batch.loss_mask[1].sum() == 0 and batch.loss_mask[0].sum() > 0
    assert torch.equal(batch.scores, torch.tensor([1.0, 0.0, 1.0, 0.0]))
