"""`searchr1.api.score`: the reward scorers in-process. The `searchr1_*` scorers want the prompt (or the
question it is rendered from) and raise, naming the trap, without it; with it they equal Search-R1's
`compute_score_em` on prompt + response bit for bit, including its quirks."""

from __future__ import annotations

import pytest

from searchr1.api import ScoringError, score
from searchr1.core.protocol import render_prompt
from searchr1.reward.scoring import searchr1_em

RESPONSES = ["<think> x </think>\n<answer> Paris </answer>", "<answer> Lyon </answer>", "<think> none </think>",
             "<answer> The  Paris! </answer>", "no tags at all"]


@pytest.mark.parametrize("response", RESPONSES)
def test_searchr1_em_with_the_prompt_is_search_r1s_score(response):
    prompt = render_prompt("capital of France")
    expected = searchr1_em(prompt + response, {"target": ["Paris", "Beijing"]})
    assert score(response, ["Paris", "Beijing"], scorer="searchr1_em", prompt=prompt) == expected
    assert score(response, ["Paris", "Beijing"], scorer="searchr1_em", question="capital of France") == expected


def test_the_trap_is_named_not_scored_zero():
    with pytest.raises(ScoringError, match="Search-R1's prompt holds two"):
        score("<answer> Paris </answer>", ["Paris"], scorer="searchr1_em")
    assert searchr1_em("<answer> Paris </answer>", {"target": ["Paris"]}) == 0.0  # the trap itself, unchanged


def test_metric_aliases_and_bad_input():
    assert score("<answer> Paris, France </answer>", ["Paris"], scorer="cover_em") == 1.0
    assert score("<answer> Paris, France </answer>", ["Paris"], scorer="em") == 0.0
    assert score("<answer> Paris </answer>", "Paris") == 1.0  # one gold as a string
    with pytest.raises(ScoringError, match="unknown scorer 'nope'"):
        score("x", ["y"], scorer="nope")
