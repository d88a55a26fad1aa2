"""The pipeline simulator's math on cases small enough to check by hand: the processor-sharing engine
(linear and constant-throughput iterations, prefill stalls, the sequence cap), trajectories drawn with
exact means, and the pipeline's step times for one worker under lockstep and one step of staleness
(including a group dropped as stale and its replacement)."""

from __future__ import annotations

import random

import pytest

from searchr1.simulator.engine import Engine, Linear
from searchr1.simulator.pipeline import Pipeline, Times, simulate
from searchr1.simulator.workload import Workload, sample


def _run_engine(e: Engine, arrivals: list[tuple[float, int, int, int]]) -> dict[int, float]:
    """Feed arrivals (time, seq, tokens, prefill) and return each sequence's finish time."""
    done: dict[int, float] = {}
    pending = sorted(arrivals)
    while pending or not e.idle:
        nxt = e.next_finish()
        if pending and pending[0][0] <= nxt:
            t, seq, tokens, prefill = pending.pop(0)
            e.add(t, seq, tokens, prefill)
        else:
            for seq in e.pop_finished(nxt):
                done[seq] = nxt
    return done


def test_constant_throughput_engine_shares_one_rate():
    # CPU shape: 0.01 s per token of the whole engine, however many sequences share it
    done = _run_engine(Engine(Linear(0.0, 0.01)), [(0.0, 1, 10, 0), (0.0, 2, 20, 0)])
    assert done[1] == pytest.approx(0.2)   # 10 tokens each at 2 × 0.01 s per iteration
    assert done[2] == pytest.approx(0.3)   # then 10 more alone at 0.01 s: 30 tokens × 0.01 s in all


def test_linear_engine_batches_and_stalls_for_prefill():
    a, b = 0.004, 0.001
    done = _run_engine(Engine(Linear(a, b)), [(0.0, 1, 10, 0), (0.0, 2, 20, 0)])
    assert done[1] == pytest.approx(10 * (a + 2 * b))
    assert done[2] == pytest.approx(10 * (a + 2 * b) + 10 * (a + b))
    e = Engine(Linear(a, b), prefill_s_per_token=0.0005)
    done = _run_engine(e, [(0.0, 1, 10, 100)])
    assert done[1] == pytest.approx(100 * 0.0005 + 10 * (a + b))
    assert e.busy_s == pytest.approx(done[1]) and e.tokens == pytest.approx(10)


def test_sequence_cap_queues_the_rest():
    done = _run_engine(Engine(Linear(0.0, 0.01), max_seqs=1), [(0.0, 1, 10, 0), (0.0, 2, 10, 0)])
    assert done == {1: pytest.approx(0.1), 2: pytest.approx(0.2)}


def test_trajectories_keep_their_means():
    w = Workload(prompt_tokens=100, generated_tokens=90, searches=2, obs_tokens=50, length_cv=0.0)
    t = sample(w, random.Random(0))
    assert t.turns == ((100, 30), (50, 30), (50, 30)) and t.trained_tokens == 100 + 90 + 100
    w = Workload(prompt_tokens=10, generated_tokens=120, searches=1.25, obs_tokens=0, length_cv=0.5)
    rng = random.Random(1)
    samples = [sample(w, rng) for _ in range(4000)]
    assert sum(len(s.turns) - 1 for s in samples) / 4000 == pytest.approx(1.25, abs=0.03)
    assert sum(g for s in samples for _, g in s.turns) / 4000 == pytest.approx(120 * 1.0, rel=0.05)
    with pytest.raises(ValueError, match="searches per trajectory"):
        Workload(prompt_tokens=1, generated_tokens=1, searches=5, obs_tokens=1, max_turns=4)


ONE_TURN = Workload(prompt_tokens=0, generated_tokens=100, searches=0, obs_tokens=0, length_cv=0.0)


def _times(train=3.0, reload=0.5, group=0.0, search=0.0) -> Times:
    # one 100-token turn at 0.01 s per token: 1 s of generation per group
    return Times(engine=lambda: Engine(Linear(0.0, 0.01)), train_s=lambda tokens: train, reload_s=reload,
                 group_s=group, search_s=search)


def test_lockstep_one_worker_exact_step_times():
    p = Pipeline(workers=1, groups_per_step=1, group_size=1, max_staleness=0, max_concurrent=1, weight_poll_s=100)
    r = simulate(p, _times(group=0.25), ONE_TURN, steps=3)
    # step 1: generate 1 s + publish the group 0.25 s + train 3 s; then each step adds a 0.5 s reload
    assert r.step_end_s == pytest.approx([4.25, 9.0, 13.75])
    assert r.learner_busy_s == pytest.approx(9.0) and r.rollout_busy_s == pytest.approx([3.0 + 1.0])
    assert r.reloads == 2 and r.staleness == [0, 0, 0] and r.dropped == 0
    assert r.learner_idle_share == pytest.approx(1 - 9.0 / 13.75)


def test_one_step_of_staleness_overlaps_and_drops_a_group_sampled_two_versions_back():
    """A worker that moves only at its poll (the what-if): a task read just after a step starts on the
    previous weights."""
    p = Pipeline(workers=1, groups_per_step=1, group_size=1, max_staleness=1, max_concurrent=1, weight_poll_s=100,
                 newest_on_read=False)
    r = simulate(p, _times(), ONE_TURN, steps=4)
    # A [0,1] v0 → step 1 [1,4]; B [1,2] v0 → step 2 [4,7] (lag 1); C read at 4 with min version 0 runs
    # [4,5] on v0 and is dropped at 7 (lag 2); D (min 1) waits for a reload [7,7.5] and runs [7.5,8.5] → step 3
    # [8.5,11.5]; E, the replacement for C, runs [8.5,9.5] on v2 → step 4 [11.5,14.5]
    assert r.step_end_s == pytest.approx([4.0, 7.0, 11.5, 14.5])
    assert r.dropped == 1 and r.staleness == [0, 1, 0, 1]


def test_a_worker_moving_to_the_newest_weights_on_read_drops_nothing():
    """The worker's rule: C, read at 4 when version 1 is announced, waits for the reload [4,4.5] and runs
    [4.5,5.5] on v1 (lag 1 at step 3, not 2); D runs on v2 after its reload [7,7.5]."""
    p = Pipeline(workers=1, groups_per_step=1, group_size=1, max_staleness=1, max_concurrent=1, weight_poll_s=100)
    r = simulate(p, _times(), ONE_TURN, steps=4)
    assert r.step_end_s == pytest.approx([4.0, 7.0, 10.0, 13.0])
    assert r.dropped == 0 and r.staleness == [0, 1, 1, 1]


def test_searches_between_turns_hold_no_engine_time():
    w = Workload(prompt_tokens=0, generated_tokens=100, searches=1, obs_tokens=0, length_cv=0.0)
    p = Pipeline(workers=1, groups_per_step=1, group_size=1, max_staleness=0, max_concurrent=1, weight_poll_s=100)
    r = simulate(p, _times(search=2.0), w, steps=1)
    assert r.step_end_s == pytest.approx([0.5 + 2.0 + 0.5 + 3.0])  # two 50-token turns, a 2 s search between
    assert r.rollout_busy_s == pytest.approx([1.0])


def test_a_pipeline_that_cannot_fill_a_step_is_an_error():
    p = Pipeline(workers=1, groups_per_step=1, group_size=1, max_staleness=0)
    with pytest.raises(ValueError, match="must be >= 1"):
        simulate(p, _times(), ONE_TURN, steps=0)
