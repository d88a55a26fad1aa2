"""Warm-start traces: exact protocol text, the right segments masked, each imperfect kind as specified;
and the warm start's pure helpers (micro-batching, schedule, copy drills)."""

from __future__ import annotations

import math
import random

from searchr1.core.protocol import is_well_formed, observation_for, parse_action
from searchr1.world.generator import generate_world
from searchr1.world.search import CorpusSearch
from searchr1.world.settings import GeneratorSettings, WarmstartSettings
from searchr1.world.sft_data import IGNORE, copy_example
from searchr1.world.traces import TraceRates, make_trace
from searchr1.world.training import lr_at, micro_batches

GEN = GeneratorSettings(people=30, cities=8, companies=6, countries=3, known_people=4, known_cities=2,
                        known_companies=2, known_countries=1)
WORLD = generate_world(GEN, 11)
SEARCH = CorpusSearch(WORLD.corpus()).search

def _rates(**warmstart) -> TraceRates:
    return TraceRates.from_settings(WarmstartSettings(**warmstart))


PERFECT = _rates(p_guess=0, p_needless_search=0, p_noisy_query=0, p_wrong_copy=0)


def _q(known: bool, hops: int):
    return next(q for q in WORLD.questions(known=known) if len(q.hops) == hops)


def test_unknown_two_hop_trace_searches_each_hop_and_copies_the_fact():
    q = _q(False, 2)
    t = make_trace(WORLD, q, SEARCH, PERFECT, random.Random(0))
    assert t.kind == "search" and t.searches == 2
    policy = [s for s in t.segments if s.policy]
    env = [s for s in t.segments if not s.policy]
    assert len(policy) == 3 and len(env) == 2
    for i, (turn, obs) in enumerate(zip(policy, env)):
        action = parse_action(turn.text)
        assert action.kind == "search"
        hits = SEARCH(action.content, 3)
        assert obs.text == observation_for([WORLD.corpus()[h] for h in hits])  # exactly the env's text
        assert WORLD.doc_of[q.hops[i].subject] in hits
        assert turn.text.startswith("<think> ") and turn.text.endswith(" </search>")
    last = policy[-1].text
    final_fact = WORLD.fact_sentence(WORLD.by_id[q.hops[-1].subject], q.hops[-1].attr)
    assert last == f"<think> {final_fact} </think>\n<answer> {q.answers[0]} </answer><|im_end|>"
    assert t.answer == q.answers[0]
    assert is_well_formed(t.response_text)


def test_known_question_is_answered_from_memory():
    q = _q(True, 2)
    t = make_trace(WORLD, q, SEARCH, PERFECT, random.Random(0))
    assert t.kind == "memory" and t.searches == 0 and len(t.segments) == 1 and t.segments[0].policy
    assert t.answer == q.answers[0] and is_well_formed(t.response_text)


def test_imperfect_kinds():
    rng = random.Random(1)
    needless = make_trace(WORLD, _q(True, 1), SEARCH, _rates(p_needless_search=1, p_noisy_query=0,
                                                                  p_wrong_copy=0), rng)
    assert needless.kind == "needless_search" and needless.searches >= 1 and needless.answer == _q(True, 1).answers[0]
    guess = make_trace(WORLD, _q(False, 1), SEARCH, _rates(p_guess=1), rng)
    assert guess.kind == "guess" and guess.searches == 0 and guess.answer != _q(False, 1).answers[0]
    wrong = make_trace(WORLD, _q(False, 1), SEARCH, _rates(p_guess=0, p_noisy_query=0, p_wrong_copy=1), rng)
    assert wrong.kind == "wrong_copy" and wrong.answer != _q(False, 1).answers[0]
    assert is_well_formed(wrong.response_text) and is_well_formed(guess.response_text)


def test_a_search_that_misses_the_gold_passage_is_retried_with_the_name():
    q = _q(False, 1)
    gold = WORLD.doc_of[q.hops[0].subject]
    calls = []

    def missing_first(query: str, k: int) -> list[int]:
        calls.append(query)
        hits = SEARCH(query, k)
        return [h for h in hits if h != gold][:k] if len(calls) == 1 else hits

    t = make_trace(WORLD, q, missing_first, PERFECT, random.Random(0))
    assert t.kind == "retry" and t.searches == 2
    assert calls[1] == WORLD.by_id[q.hops[0].subject].name
    assert "The results do not mention" in t.segments[2].text and t.answer == q.answers[0]


def test_trace_mix_is_deterministic_and_contains_every_kind():
    ws = WarmstartSettings()
    rates = TraceRates.from_settings(ws)
    qs = WORLD.questions()

    def kinds(seed):
        rng = random.Random(seed)
        return [make_trace(WORLD, rng.choice(qs), SEARCH, rates, rng).kind for _ in range(300)]

    a = kinds(0)
    assert a == kinds(0)
    assert {"search", "guess", "memory", "needless_search", "wrong_copy"} <= set(a)


def test_micro_batches_group_by_length_within_budget():
    lengths = [10, 50, 12, 48, 11, 30]
    groups = micro_batches(lengths, max_tokens=60)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert groups == [[0, 4, 2], [5], [3], [1]]  # sorted 10,11,12 (3×12=36); then 4×30=120, 2×48, 2×50 > 60
    for g in groups:
        assert max(lengths[i] for i in g) * len(g) <= 60 or len(g) == 1
    assert micro_batches([100], max_tokens=10) == [[0]]


def test_lr_schedule():
    ws = WarmstartSettings(steps=110, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert math.isclose(lr_at(0, ws), 1e-4)
    assert math.isclose(lr_at(9, ws), 1e-3)
    assert math.isclose(lr_at(10, ws), 1e-3)
    assert math.isclose(lr_at(60, ws), 1e-3 * (0.1 + 0.9 * 0.5))
    assert math.isclose(lr_at(110, ws), 1e-4)


def test_copy_drill_labels_only_what_looking_back_predicts():
    rng = random.Random(0)
    lengths = set()
    for _ in range(50):
        ids, labels = copy_example(rng, 100, first_id=3)
        assert len(ids) == len(labels) and all(3 <= i < 100 for i in ids)
        trained = [i for i, x in enumerate(labels) if x != IGNORE]
        n = len(trained) + 1  # the repeated sequence; its first token is not predictable, so not trained
        assert 8 <= n <= 40 and trained == list(range(len(ids) - n + 1, len(ids)))
        seq = ids[-n:]
        # the same sequence occurs earlier, at a distance that varies from drill to drill
        starts = [s for s in range(len(ids) - 2 * n + 1) if ids[s:s + n] == seq]
        assert starts, ids
        lengths.add(len(ids) - n - starts[-1])
        assert [labels[i] for i in trained] == seq[1:]
    assert len(lengths) > 10
