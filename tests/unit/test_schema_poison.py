"""Schema-valid poison refused at the edge: -inf or +inf behaviour log-probs, non-finite reward
components, and rewards or log-probs past the range the learner trains in (float32) fail validation, so
they reach the dead stream with the reason instead of the learner; the learner's poison screen names them
again in a group written without validation, and its trial build names what no rule does."""

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


@pytest.mark.parametrize("reward", [3.5e38, -3.5e38, 1.1e18, 1e300])
def test_rewards_past_the_trained_range_refused(reward):
    """Finite in float64 and past what the learner trains in (float32): refused with the range named."""
    with pytest.raises(ValidationError, match=r"outside \[-1e\+18, 1e\+18\], the range the learner trains in"):
        _traj(reward=reward)


def test_rewards_and_logprobs_at_the_bound_pass():
    t = _traj(reward=-1e18, behavior_logprobs=[-1e18, 0.0])
    assert t.reward == -1e18


def test_logprobs_past_the_trained_range_refused():
    with pytest.raises(ValidationError, match=r"in \[-1e\+18, 0\].*got -3.5e\+38"):
        _traj(behavior_logprobs=[-0.5, -3.5e38])


def test_the_poison_screen_and_the_batch_builder_name_what_an_older_writer_let_through():
    """A group built without validation (as an older release could have written it): the screen names a
    reward past the range; a token id past int64 (no vocabulary to check it against) is named by the
    trial build, where `build_batch` would have raised in the middle of a step."""
    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.algo.poison import batch_problem, group_problem
    from tests.support.synthetic import synthetic_group

    good = synthetic_group("ok", group_size=2, vocab=64)
    huge = good.model_copy(update={"trajectories": [good.trajectories[0].model_copy(update={"reward": 3.5e38}),
                                                    good.trajectories[1]]})
    with pytest.raises(RuntimeError):
        build_batch([huge])  # what the screen prevents: float32 cannot hold it
    assert group_problem(huge, 64) == "trajectory 0: reward 3.5e+38 (trained in float32: at most 1e+18 in magnitude)"
    ids = [2**63, *good.trajectories[1].response_ids[1:]]
    wide = good.model_copy(update={"trajectories": [good.trajectories[0],
                                                    good.trajectories[1].model_copy(update={"response_ids": ids})]})
    assert group_problem(wide, None) is None  # no vocabulary: ids only checked to be non-negative
    assert batch_problem(wide) == "the batch builder refuses it: ValueError: Overflow when unpacking long long"
    assert batch_problem(good) is None and group_problem(good, 64) is None
