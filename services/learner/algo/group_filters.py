"""DAPO's data filters on trajectory groups, before batching (pure: groups in, groups and counts out).

- Dynamic sampling (`split_flat_groups`): a group whose rewards are all equal gets a zero GRPO advantage
  on every trajectory, so it adds tokens to the step but no gradient signal; DAPO drops such groups and
  samples more until the step is full. Under our GRPO rule a group of one has advantage = its raw reward
  (mean 0, std 1, as veRL does), so a singleton is flat only when its reward is 0 — the test is "every
  advantage of the group is zero", whatever the group size.
- Overlong filtering (`mask_overlong`): a response cut by the length limit (finish reason "length") is
  kept for its group's statistics but trains no token (loss mask 0), so truncation is not punished as if
  it were a wrong answer (DAPO's overlong filtering; the soft overlong *penalty* is a reward, not here).

Reading more groups until a step is full is the learner service's loop; this module only decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from searchr1.core.schemas import TrajectoryGroup


@dataclass(frozen=True)
class FlatSplit:
    """Outcome of `split_flat_groups`."""

    informative: list[TrajectoryGroup]
    """Groups with at least one non-zero advantage, in input order."""
    flat: list[TrajectoryGroup]
    """Groups whose advantages are all zero, in input order."""
    all_solved: int
    """Flat groups of two or more trajectories whose common reward is > 0 (e.g. every answer right)."""
    all_failed: int
    """Flat groups whose common reward is <= 0 (e.g. every answer wrong)."""


def is_flat(group: TrajectoryGroup) -> bool:
    """True when every GRPO advantage of the group is zero: equal rewards (two or more trajectories), or a
    lone trajectory with reward 0."""
    rewards = [t.reward for t in group.trajectories]
    if len(rewards) == 1:
        return rewards[0] == 0.0
    return max(rewards) == min(rewards)


def split_flat_groups(groups: Sequence[TrajectoryGroup]) -> FlatSplit:
    """(informative, flat) groups plus counts of the flat ones by their common reward's sign."""
    informative, flat = [], []
    solved = failed = 0
    for g in groups:
        if not is_flat(g):
            informative.append(g)
            continue
        flat.append(g)
        if g.trajectories[0].reward > 0:
            solved += 1
        else:
            failed += 1
    return FlatSplit(informative, flat, solved, failed)


def mask_overlong(groups: Sequence[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], int]:
    """The groups with every length-truncated trajectory's loss mask (and, keeping the wire invariant, its
    behaviour log-probs) set to 0, rewards unchanged, and
    how many trajectories were masked. Groups without such trajectories are returned as they are."""
    out, masked = [], 0
    for g in groups:
        cut = [t.finish_reason == "length" for t in g.trajectories]
        if not any(cut):
            out.append(g)
            continue
        masked += sum(cut)
        trajectories = [
            t.model_copy(update={"loss_mask": [0] * len(t.loss_mask),
                                 "behavior_logprobs": [0.0] * len(t.behavior_logprobs)}) if c else t
            for t, c in zip(g.trajectories, cut)
        ]
        out.append(g.model_copy(update={"trajectories": trajectories}))
    return out, masked
