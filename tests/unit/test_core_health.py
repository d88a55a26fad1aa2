"""Collapse signals (`searchr1.core.health`) against hand-checked numbers."""

from __future__ import annotations

import pytest

from searchr1.core.health import SIGNALS, queries, repeated, step_signals, text_features

GOOD = ("<think>a</think><search>Paris France</search><information>x</information><think>b c</think>"
        "<search>paris, france</search><information>y</information><think>d</think><answer>The Eiffel Tower</answer>")
MALFORMED = "I think <answer>x"
SHORT = "<think>one two three</think><answer>x</answer>"


def test_queries_are_normalized_and_repeats_counted():
    assert queries(GOOD) == ["paris france", "paris france"]
    assert repeated(["a", "b", "a", "a"]) == 2 and repeated([]) == 0


def test_text_features():
    f = text_features(GOOD)
    assert (f.malformed, f.queries, f.repeated_queries, f.answer_words, f.think_words) == (False, 2, 1, 3, 4)
    f = text_features(MALFORMED)
    assert (f.malformed, f.queries, f.answer_words, f.think_words) == (True, 0, 0, 0)
    assert text_features(SHORT).think_words == 3


def test_step_signals_hand_checked():
    s = step_signals([GOOD, MALFORMED, SHORT], [2, 0, 0], ["answer", "length", "answer"])
    assert set(s) == set(SIGNALS)
    assert s["malformed_rate"] == pytest.approx(1 / 3)
    assert s["repeated_query_rate"] == pytest.approx(1 / 2)  # 1 repeat over 2 queries
    assert s["searches_mean"] == pytest.approx(2 / 3)
    assert s["answer_words_mean"] == pytest.approx(4 / 3)  # 3 + 0 + 1
    assert s["think_words_mean"] == pytest.approx(7 / 3)  # 4 + 0 + 3
    assert s["truncated_rate"] == pytest.approx(1 / 3)


def test_step_signals_of_an_empty_step_are_zero():
    assert step_signals([], [], []) == {k: 0.0 for k in SIGNALS}
    assert step_signals([SHORT], [0], ["answer"])["repeated_query_rate"] == 0.0  # no query: no repeat
