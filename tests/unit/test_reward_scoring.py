"""Pure reward math: Search-R1's exact scorer semantics (docs/architecture.md, "Reward semantics") with
hand-checked values on real Qwen-style prompt strings, our response-only scorers, and hypothesis
properties. The protocol functions they compose (extraction, normalisation, the grammar) are tested in
test_protocol.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.core.protocol import INVALID_ACTION_MESSAGE, make_prompt, observation_for
from searchr1.reward import scoring as s

QWEN_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"


def qwen_prompt(question: str) -> str:
    """What Qwen2.5's chat template renders for the Search-R1 user message (add_generation_prompt)."""
    return f"{QWEN_SYSTEM}<|im_start|>user\n{make_prompt(question)}<|im_end|>\n<|im_start|>assistant\n"


PROMPT = qwen_prompt("what is the capital of france")
GT = {"target": ["Paris", "City of Paris"]}
OBS_PARIS = observation_for(["Paris\nParis is the capital and largest city of France."])
OBS_OTHER = observation_for(["Lyon\nLyon is a city in France."])
FORMAT_ARGS = {"structure_format_score": 0.2, "final_format_score": 0.1, "retrieval_score": 0.1}


# --------------------------------------------------------------------------------------------------
# Search-R1 scorers on the real prompt
# --------------------------------------------------------------------------------------------------


def test_prompt_alone_scores_beijing():
    """With no answer in the response, Search-R1's extraction reads the prompt's example, `Beijing`."""
    assert s.searchr1_em(PROMPT + "<think>no idea</think>", {"target": ["Beijing"]}) == 1.0
    assert s.searchr1_em(PROMPT + "<think>no idea</think>", GT) == 0.0


def test_invalid_action_message_scores_and():
    text = PROMPT + "<think>hmm</think>I guess it is Paris." + INVALID_ACTION_MESSAGE
    assert s.searchr1_em(text, GT) == 0.0
    assert s.searchr1_em(text, {"target": ["and"]}) == 1.0
    assert s.searchr1_em(text, GT, format_score=0.25) == 0.25  # an extracted wrong answer gets format_score


def test_fewer_than_two_matches_is_no_answer():
    assert s.searchr1_em("<answer> Paris </answer>", GT) == 0.0
    assert s.searchr1_em("<answer> Paris </answer>", GT, format_score=0.5) == 0.0  # None → 0, not format_score


def test_two_answers_last_wins():
    response = "<think>a</think><answer> Lyon </answer><think>no</think><answer> Paris </answer>"
    assert s.searchr1_em(PROMPT + response, GT) == 1.0
    reverse = "<think>a</think><answer> Paris </answer><think>no</think><answer> Lyon </answer>"
    assert s.searchr1_em(PROMPT + reverse, GT) == 0.0


def test_searchr1_em_and_subem_normalise():
    text = PROMPT + "<think>x</think><answer>the city of PARIS!</answer>"
    assert s.searchr1_em(text, GT) == 1.0            # "city of paris" == normalised "City of Paris"
    assert s.searchr1_em(PROMPT + "<answer>Paris, France</answer>", GT) == 0.0
    assert s.searchr1_subem(PROMPT + "<answer>Paris, France</answer>", GT) == 1.0  # "paris" in "paris france"
    assert s.searchr1_subem(PROMPT + "<answer>Par</answer>", GT) == 0.0
    assert s.searchr1_em(PROMPT + "<answer>1000</answer>", {"target": ["1,000"]}) == 1.0
    assert s.searchr1_em(PROMPT + "<answer>x</answer>", GT, score=2.0, format_score=0.5) == 0.5
    assert s.searchr1_em(PROMPT + "<answer>paris</answer>", GT, score=2.0) == 2.0


def test_string_target_is_one_answer():
    assert s.searchr1_em(PROMPT + "<answer>Paris</answer>", {"target": "Paris"}) == 1.0


# --------------------------------------------------------------------------------------------------
# Search-R1 format variant
# --------------------------------------------------------------------------------------------------

GOOD = ("<think>I need to search.</think>\n<search> capital of france </search>" + OBS_PARIS
        + "<think>It is Paris.</think>\n<answer> Paris </answer>")


def test_em_format_hand_checked():
    # well-formed, correct → score
    assert s.searchr1_em_format(PROMPT + GOOD, GT, **FORMAT_ARGS) == 1.0
    # correct but malformed (the decoded <|im_end|> after </answer>) → score - structure_format_score
    assert s.searchr1_em_format(PROMPT + GOOD + "<|im_end|>", GT, **FORMAT_ARGS) == pytest.approx(0.8)
    # well-formed, wrong, gold in an <information> block → structure + retrieval
    wrong = GOOD.replace("<answer> Paris </answer>", "<answer> Lyon </answer>")
    assert s.searchr1_em_format(PROMPT + wrong, GT, **FORMAT_ARGS) == pytest.approx(0.3)
    # well-formed, wrong, no gold retrieved → structure
    wrong_other = wrong.replace(OBS_PARIS, OBS_OTHER)
    assert s.searchr1_em_format(PROMPT + wrong_other, GT, **FORMAT_ARGS) == pytest.approx(0.2)
    # malformed, wrong → final_format_score
    assert s.searchr1_em_format(PROMPT + "<answer> Lyon </answer>", GT, **FORMAT_ARGS) == pytest.approx(0.1)
    # no answer in the response: the prompt's "Beijing" is extracted (wrong), malformed → final_format_score
    assert s.searchr1_em_format(PROMPT + "<think>no idea", GT, **FORMAT_ARGS) == pytest.approx(0.1)
    # Search-R1 defaults (all 0, score 1): only correct answers count
    assert s.searchr1_em_format(PROMPT + wrong, GT) == 0.0
    assert s.searchr1_em_format(PROMPT + GOOD + "<|im_end|>", GT) == 1.0


def test_em_format_no_answer_branch():
    # fewer than two <answer> matches in the whole text → None: well-formed → structure (+ retrieval)
    text = "<|im_start|>assistant\n<think>a</think><search>q</search>" + OBS_PARIS + "<think>b</think><answer>Lyon</answer>"
    assert s.searchr1_em_format(text, GT, **FORMAT_ARGS) == pytest.approx(0.3)
    assert s.searchr1_em_format(text.replace(OBS_PARIS, OBS_OTHER), GT, **FORMAT_ARGS) == pytest.approx(0.2)
    # malformed and no answer → 0
    assert s.searchr1_em_format("<|im_start|>assistant\n<think>a</think>", GT, **FORMAT_ARGS) == 0.0


def test_em_format_retrieval_scans_the_prompt():
    """The prompt's own `<information> and </information>` is an information block: a gold "and" is
    always "retrieved" (Search-R1 bug kept)."""
    wrong = PROMPT + "<think>x</think><answer> Lyon </answer>"
    assert s.searchr1_em_format(wrong, {"target": ["and"]}, **FORMAT_ARGS) == pytest.approx(0.3)
    assert s.searchr1_em_format(wrong, GT, **FORMAT_ARGS) == pytest.approx(0.2)


def test_em_format_breakdown():
    b = s.searchr1_em_format_breakdown(PROMPT + GOOD + "<|im_end|>", GT, **FORMAT_ARGS)
    assert (b.valid_format, b.has_answer, b.answer_correct) == (False, True, True)
    assert b.score == pytest.approx(0.8)


# --------------------------------------------------------------------------------------------------
# our response-only scorers
# --------------------------------------------------------------------------------------------------


def test_exact_and_substring_on_response_alone():
    assert s.exact_match("<think>x</think>", ["Beijing"]) == 0.0        # no answer → 0 (no prompt leak)
    assert s.exact_match("<answer> The Paris </answer>", ["paris"]) == 1.0
    assert s.exact_match("<answer>Lyon</answer><answer>Paris</answer>", ["Paris"]) == 1.0
    assert s.exact_match("<answer>Paris</answer><answer>Lyon</answer>", ["Paris"]) == 0.0
    assert s.substring_match("<answer>Paris, France</answer>", ["paris"]) == 1.0
    assert s.exact_match("<answer>the</answer>", ["a"]) == 0.0            # empty golds never match
    assert s.substring_match("<answer>anything</answer>", ["the"]) == 0.0


def test_token_f1_hand_checked():
    # pred tokens [paris, france], gold [paris]: P = 1/2, R = 1 → F1 = 2/3
    assert s.f1_score("<answer>Paris, France</answer>", ["Paris"]) == pytest.approx(2 / 3)
    # best over golds; [city, of, paris] vs [paris]: P = 1/3, R = 1 → 0.5; exact second gold → 1
    assert s.f1_score("<answer>City of Paris</answer>", ["Paris", "city of paris"]) == pytest.approx(1.0)
    assert s.token_f1("city of paris", "paris") == pytest.approx(0.5)
    assert s.token_f1("a b", "c") == 0.0
    assert s.f1_score("no answer", ["x"]) == 0.0
    # repeated tokens count by multiplicity: pred [x, x], gold [x] → common 1, P = 1/2, R = 1 → 2/3
    assert s.token_f1("x x", "x") == pytest.approx(2 / 3)


def test_format_score_any_template():
    good = "<think>x</think><search>q</search>" + OBS_PARIS + "<think>y</think><answer>Paris</answer>"
    for end in ("", "<|im_end|>", "<|eot_id|>", "</s>", "<|im_end|>\n<|endoftext|>"):
        assert s.format_score(good + end) == 1.0, end
    assert s.format_score(good + "trailing words") == 0.0
    assert s.format_score("<answer>Paris</answer>") == 0.0
    assert s.format_score(good + "<|im_end|>", end_markers=[]) == 0.0


def test_retrieval_hit_and_search_cost():
    response = "<think>x</think><search>q</search>" + OBS_PARIS + "<answer>Lyon</answer>"
    assert s.retrieval_hit(response, ["PARIS"]) == 1.0
    assert s.retrieval_hit(response, ["Marseille"]) == 0.0
    assert s.retrieval_hit("<answer>Paris</answer>", ["Paris"]) == 0.0
    assert s.search_cost(3, cost_per_search=0.1) == pytest.approx(-0.3)
    assert s.search_cost(3, cost_per_search=0.1, free_searches=2) == pytest.approx(-0.1)
    assert s.search_cost(50, cost_per_search=0.1, max_cost=1.0) == -1.0
    assert s.search_cost(0) == 0.0
    with pytest.raises(ValueError):
        s.search_cost(-1)


def test_cosine_and_verdicts():
    assert s.cosine_similarity([1, 0], [0, 1]) == 0.0
    assert s.cosine_similarity([3, 4], [6, 8]) == pytest.approx(1.0)
    assert s.best_similarity([1, 0], [[-1, 0], [0.6, 0.8]]) == pytest.approx(0.6)
    assert s.best_similarity([1, 0], [[-1, 0]]) == 0.0
    assert s.best_similarity([1, 0], [[-1, 0]], clip_negative=False) == pytest.approx(-1.0)
    assert s.best_similarity([1, 0], []) == 0.0
    for text, verdict in [("Yes", 1.0), ("yes.", 1.0), ("**Correct**", 1.0), ("No, it is not", 0.0),
                          ("0.75", 0.75), ("1", 1.0), ("maybe", None), ("", None), ("2", None)]:
        assert s.parse_judge_verdict(text) == verdict, text


# --------------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------------

answers = st.lists(st.sampled_from(["Paris", "the Paris", "PARIS!", "a b", "1,000", "1000", "Café", "and",
                                    "x", "", "Lyon – France"]), max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), answers, st.sampled_from(["", "<think>x</think>", INVALID_ACTION_MESSAGE]))
def test_em_implies_subem_and_scores_in_range(answer, golds, before):
    text = PROMPT + before + f"<answer>{answer}</answer>"
    gt = {"target": golds}
    em, subem = s.searchr1_em(text, gt), s.searchr1_subem(text, gt)
    assert em in (0.0, 1.0) and subem in (0.0, 1.0)
    assert em <= subem
    response = before + f"<answer>{answer}</answer>"
    ours_em, ours_sub = s.exact_match(response, golds), s.substring_match(response, golds)
    assert ours_em <= ours_sub
    f1 = s.f1_score(response, golds)
    assert 0.0 <= f1 <= 1.0
    if ours_em == 1.0:
        assert f1 == pytest.approx(1.0)
    fmt = s.searchr1_em_format(text, gt, **FORMAT_ARGS)
    assert 0.0 <= fmt <= 1.0
    assert s.retrieval_hit(response, golds) in (0.0, 1.0)
    assert s.format_score(response) in (0.0, 1.0)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 1000), st.floats(0, 10), st.integers(0, 100), st.floats(0, 100))
def test_search_cost_in_range(n, cost, free, cap):
    value = s.search_cost(n, cost, free, cap)
    assert -cap <= value <= 0.0
