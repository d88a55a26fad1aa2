"""Per-step figures: the EM component lookup and the per-data_source breakdown in the JSONL log."""

from __future__ import annotations

import random

from searchr1.learner.algo.figures import by_source, em_component
from tests.support.synthetic import synthetic_group


def test_em_component_keys_in_order():
    assert em_component({"em": 1.0, "searchr1_em": 0.0}) == 1.0
    assert em_component({"searchr1_em": 0.0}) == 0.0
    assert em_component({"exact_match": 1.0, "f1": 0.5}) == 1.0
    assert em_component({"f1": 0.5}) is None
    # searchr1_em_format's breakdown, alone and inside a composite
    assert em_component({"searchr1_em_format": 0.2, "valid_format": 1.0, "answer_correct": 0.0}) == 0.0
    assert em_component({"searchr1_em_format": 0.8, "searchr1_em_format.answer_correct": 1.0,
                         "searchr1_em_format.valid_format": 0.0, "search_cost": -0.2}) == 1.0


def test_by_source_splits_reward_em_and_searches():
    rng = random.Random(0)
    known = synthetic_group("k", group_size=2, rewards=[1.0, 1.0], rng=rng)
    known.task.data_source = "world_known_single_hop"
    unknown = synthetic_group("u", group_size=4, rewards=[1.0, 0.0, 0.0, 0.0], rng=rng)
    unknown.task.data_source = "world_unknown_single_hop"
    for t, s in zip(unknown.trajectories, [1, 1, 0, 2]):
        t.num_searches = s
    for t in known.trajectories:
        t.num_searches = 0
    out = by_source([unknown, known])
    assert list(out) == ["world_known_single_hop", "world_unknown_single_hop"]
    assert out["world_known_single_hop"] == {"trajectories": 2.0, "reward_mean": 1.0,
                                             "searches_per_trajectory": 0.0, "em_mean": 1.0}
    u = out["world_unknown_single_hop"]
    assert u["trajectories"] == 4.0 and u["reward_mean"] == 0.25 and u["em_mean"] == 0.25
    assert u["searches_per_trajectory"] == 1.0
