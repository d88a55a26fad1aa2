"""Schema-valid poison refused at the edge: -inf or +inf behaviour log-probs and non-finite reward
components fail validation, so they reach the dead stream with the reason instead of the learner."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from searchr1.core.schemas import Trajectory


def _traj(**kw) -> Trajectory:
    base = {"prompt_ids": [1, 2], "response_ids": [3, 4], "loss_mask": [1, 1], "behavior_logprobs": [-0.5, -1.0]}
    return Trajectory(**{**base, **kw})


def test_valid_trajectory_passes():
    assert _traj().reward == 0.0


@pytest.mark.parametrize("bad", [[-math.inf, -1.0], [-0.5, math.inf], [math.nan, -1.0]])
def test_non_finite_logprobs_refused(bad):
    with pytest.raises(ValidationError, match="finite"):
        _traj(behavior_logprobs=bad)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_reward_components_refused(bad):
    with pytest.raises(ValidationError, match="finite"):
        _traj(reward_components={"em": bad})
