"""Per-step figures of the groups a step trained on: reward, exact match, searches, lengths, staleness,
and the per-`data_source` breakdown of the JSONL step log. Pure (groups in, numbers out); the trainer's
own figures (losses, gradient norm) come from `train/trainer.py`, and where they are sent from `metrics.py`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from searchr1.core.schemas import TrajectoryGroup
from searchr1.core.segments import group_oldest_version

EM_COMPONENT_KEYS = ("em", "searchr1_em", "exact_match", "answer_correct")
"""Reward components read as exact match, first found wins (the composite's `em` key, Search-R1's
`searchr1_em` scorer, the `exact_match` scorer, `searchr1_em_format`'s `answer_correct` fact); inside a
composite's breakdown also as `<component>.<key>` (e.g. `searchr1_em_format.answer_correct`)."""


def em_component(components: dict[str, float]) -> float | None:
    """The exact-match component of a trajectory's reward breakdown, if it has one."""
    for key in EM_COMPONENT_KEYS:
        if key in components:
            return components[key]
    for key in EM_COMPONENT_KEYS:
        for name, value in components.items():
            if name.endswith("." + key):
                return value
    return None


def group_figures(groups: Sequence[TrajectoryGroup], version: int) -> dict[str, float]:
    """Counts and means over the step's groups; `staleness_mean` is measured against the learner's
    `version` before the step."""
    trajs = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajs]
    out = {
        "groups": float(len(groups)), "trajectories": float(len(trajs)),
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "searches_per_trajectory": statistics.fmean(t.num_searches for t in trajs),
        "response_length_mean": statistics.fmean(len(t.response_ids) for t in trajs),
        "staleness_mean": statistics.fmean(version - group_oldest_version(g) for g in groups),
    }
    em = [v for t in trajs if (v := em_component(t.reward_components)) is not None]
    if em:
        out["em_mean"] = statistics.fmean(em)
    return out


def by_source(groups: Sequence[TrajectoryGroup]) -> dict[str, dict[str, float]]:
    """Per-`data_source` reward, EM and searches of the step (the JSONL log's `by_source`), so a run
    can be split e.g. into known- and unknown-entity questions."""
    buckets: dict[str, list] = {}
    for g in groups:
        buckets.setdefault(g.task.data_source, []).extend(g.trajectories)
    out: dict[str, dict[str, float]] = {}
    for source, trajs in sorted(buckets.items()):
        row = {"trajectories": float(len(trajs)),
               "reward_mean": statistics.fmean(t.reward for t in trajs),
               "searches_per_trajectory": statistics.fmean(t.num_searches for t in trajs)}
        em = [v for t in trajs if (v := em_component(t.reward_components)) is not None]
        if em:
            row["em_mean"] = statistics.fmean(em)
        out[source] = row
    return out
