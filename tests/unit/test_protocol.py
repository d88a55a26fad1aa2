"""Search-R1 protocol: prompt bytes, action parsing, observation formatting, answer extraction and
normalisation, and the format grammar, with hand-checked values on real Qwen-style prompt strings."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1.core import protocol as P

EXPECTED_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n"
)


def test_prompt_is_search_r1_bytes():
    assert P.make_prompt("  who wrote hamlet ") == EXPECTED_PROMPT
    assert P.make_prompt("who wrote hamlet?") == EXPECTED_PROMPT


def test_prompt_keeps_existing_question_mark_and_unicode():
    assert P.make_prompt("Où est Zürich?").endswith("Question: Où est Zürich?\n")


def test_empty_question_and_unknown_template_rejected():
    with pytest.raises(ValueError, match="empty"):
        P.make_prompt("   ")
    with pytest.raises(ValueError, match="unknown prompt template"):
        P.make_prompt("q", template="nope")


class _ChatTok:
    chat_template = "x"

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, conversation, **kw):
        self.calls.append((conversation, kw))
        return "<|im_start|>user\n" + conversation[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"


class _BaseTok:
    chat_template = None

    def apply_chat_template(self, *a, **k):  # pragma: no cover - must not be called
        raise AssertionError


def test_render_prompt_uses_chat_template_with_generation_prompt():
    tok = _ChatTok()
    text = P.render_prompt("who wrote hamlet", tok)
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.calls[0][1] == {"add_generation_prompt": True, "tokenize": False}
    assert tok.calls[0][0] == [{"role": "user", "content": EXPECTED_PROMPT}]
    assert P.render_prompt("who wrote hamlet", _BaseTok()) == EXPECTED_PROMPT
    assert P.render_prompt("who wrote hamlet") == EXPECTED_PROMPT


@pytest.mark.parametrize(
    ("turn", "kind", "content"),
    [
        ("<think>x</think><search> capital of France </search>", "search", "capital of France"),
        ("<think>x</think><answer> Paris </answer>", "answer", "Paris"),
        # both closing tags in one turn: the first complete action wins
        ("<search>a</search> then <answer>b</answer>", "search", "a"),
        ("<answer>b</answer><search>a</search>", "answer", "b"),
        # empty query is a (valid) search with empty content, as in Search-R1
        ("<search></search>", "search", ""),
        ("<search>   </search>", "search", ""),
        # multi-line content (DOTALL)
        ("<answer>line1\nline2</answer>", "answer", "line1\nline2"),
        # unicode
        ("<search>Zürich 東京</search>", "search", "Zürich 東京"),
        # unclosed tags are invalid
        ("<search>never closed", None, ""),
        ("<answer>no end", None, ""),
        # mismatched tags are invalid
        ("<search>x</answer>", None, ""),
        # nested: the outer search closes at the first </search>; content keeps the inner text
        ("<search>a <search>b</search> c</search>", "search", "a <search>b"),
        ("<search><answer>x</answer></search>", "search", "<answer>x</answer>"),
        # no tags, or only think
        ("just text", None, ""),
        ("<think>only thinking</think>", None, ""),
        # tag names are case-sensitive
        ("<SEARCH>x</SEARCH>", None, ""),
        ("", None, ""),
    ],
)
def test_parse_action_table(turn, kind, content):
    action = P.parse_action(turn)
    assert action.kind == kind
    assert action.content == content


def test_format_docs_matches_search_r1_passages2string():
    hits = [
        {"document": {"id": "1", "contents": '"Paris"\nParis is the capital of France.'}},
        {"contents": "Lyon\nLyon is a city.\nSecond line."},
        "NoText",
    ]
    text = P.format_docs(hits)
    assert text == (
        'Doc 1(Title: "Paris") Paris is the capital of France.\n'
        "Doc 2(Title: Lyon) Lyon is a city.\nSecond line.\n"
        "Doc 3(Title: NoText) \n"
    )


def test_observation_strips_docs_and_wraps_in_information():
    obs = P.observation_for(["T\nbody"])
    assert obs == "\n\n<information>Doc 1(Title: T) body</information>\n\n"
    assert P.format_observation("") == "\n\n<information></information>\n\n"


def test_invalid_action_message_bytes():
    assert P.INVALID_ACTION_MESSAGE == (
        "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
        "</search>. If I want to give the final answer, I should put the answer between <answer> and "
        "</answer>. Let me try again.\n"
    )


def test_stop_strings():
    assert P.STOP_STRINGS == ("</search>", "</answer>")


def test_tags():
    assert P.TAGS == ("think", "search", "information", "answer")
    assert P.TAG_TOKENS == ("<think>", "</think>", "<search>", "</search>", "<information>", "</information>",
                            "<answer>", "</answer>")
    assert set(P.STOP_STRINGS) <= set(P.TAG_TOKENS)


# --------------------------------------------------------------------------------------------------
# Answers: normalisation and extraction
# --------------------------------------------------------------------------------------------------

QWEN_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
PROMPT = f"{QWEN_SYSTEM}<|im_start|>user\n{P.make_prompt('what is the capital of france')}<|im_end|>\n" \
         "<|im_start|>assistant\n"
"""What Qwen2.5's chat template renders for the Search-R1 user message (add_generation_prompt)."""
OBS_PARIS = P.observation_for(["Paris\nParis is the capital and largest city of France."])
GOOD = ("<think>I need to search.</think>\n<search> capital of france </search>" + OBS_PARIS
        + "<think>It is Paris.</think>\n<answer> Paris </answer>")


@pytest.mark.parametrize(("text", "expected"), [
    ("The  U.S.A., an Apple!", "usa apple"),
    ("1,000", "1000"),
    ("Paris – France", "paris – france"),       # en dash is not in string.punctuation: kept
    ("Café  au lait", "café au lait"),          # unicode letters kept, whitespace collapsed
    ("  A  ", ""),                              # a lone article vanishes
    ("Theatre of the Absurd", "theatre of absurd"),  # whole words only
    ("don't", "dont"),
    ("Ünïcödé\tÉTÉ\n", "ünïcödé été"),
    ("an-apple", "anapple"),                    # punctuation goes first, so no article is left to drop
])
def test_normalize_answer_hand_checked(text, expected):
    assert P.normalize_answer(text) == expected


def test_searchr1_extraction_reads_the_prompt():
    """The Search-R1 prompt holds two <answer> matches (`<answer> and </answer>`, `<answer> Beijing
    </answer>`): with no answer in the response the prompt's example is extracted, and a response ending
    with the invalid-action message extracts `and`."""
    assert P.searchr1_extract_solution(PROMPT) == "Beijing"
    assert P.searchr1_extract_solution(PROMPT + "<think>I do not know.</think>") == "Beijing"
    assert P.searchr1_extract_solution(PROMPT + "<think>hmm</think>Paris." + P.INVALID_ACTION_MESSAGE) == "and"
    response = "<think>a</think><answer> Lyon </answer><think>no</think><answer> Paris </answer>"
    assert P.searchr1_extract_solution(PROMPT + response) == "Paris"


def test_searchr1_extraction_needs_two_matches():
    assert P.searchr1_extract_solution("<answer> Paris </answer>") is None
    assert P.searchr1_extract_solution("no tags") is None
    assert P.searchr1_extract_solution("<answer>x</answer><answer>\n Paris \n</answer>") == "Paris"  # DOTALL, strip


def test_extract_answer_reads_the_response_alone():
    assert P.extract_answer("<answer> Paris </answer>") == "Paris"  # one is enough
    assert P.extract_answer("<answer> a </answer> x <answer> Brenix Works </answer>") == "Brenix Works"
    assert P.extract_answer("<answer>\nline1\nline2 </answer>") == "line1\nline2"
    assert P.extract_answer("no answer") is None
    assert P.extract_answer("<answer> unclosed") is None
    assert P.extract_answer(P.INVALID_ACTION_MESSAGE) == "and"  # the message holds `<answer> and </answer>`
    assert P.extract_answer("<answer></answer>") == ""


def test_information_blocks_and_search_count():
    text = GOOD + P.observation_for(["Lyon\nA city."])
    assert P.information_blocks(text) == ["Doc 1(Title: Paris) Paris is the capital and largest city of France.",
                                          "Doc 1(Title: Lyon) A city."]
    assert P.information_blocks("<information> unclosed") == []
    assert P.count_searches(GOOD) == 1
    assert P.count_searches(GOOD + "<search>again</search><search>open") == 2


# --------------------------------------------------------------------------------------------------
# The format grammar
# --------------------------------------------------------------------------------------------------


def test_state_machine_valid_trajectory():
    assert P.searchr1_is_valid_sequence(PROMPT + GOOD) == (True, "Valid sequence format")
    assert P.searchr1_is_valid_sequence(PROMPT + "<think>x</think><answer>y</answer>")[0]
    assert P.check_tag_sequence(GOOD) == (True, "Valid sequence format")
    assert P.check_tag_sequence("<think></think><answer></answer>\n")[0]  # empty segments are fine


@pytest.mark.parametrize(("response", "reason_start"), [
    ("<answer>Paris</answer>", "Unexpected tag <answer> in state start"),
    ("<think>x</think>text<answer>y</answer>", "Unexpected content 'text' between tags"),
    ("<think>x</think><search>q</search><answer>y</answer>", "Unexpected tag <answer> in state after_search"),
    ("<think>x</think><search>q</search>" + OBS_PARIS + "<answer>y</answer>",
     "Unexpected tag <answer> in state information"),
    ("<think>x</think><answer>y</answer><|im_end|>", "Unexpected content in state end"),
    ("<think>x</think><answer>y</answer><think>z</think>", "Unexpected tag <think> in state end"),
    ("<think>x</think><answer>y", "Mismatch in answer tags: 1 opening vs 0 closing tags"),
    ("<think>x</think>", "Incomplete sequence, ended in state after_think"),
])
def test_state_machine_rejections(response, reason_start):
    valid, reason = P.searchr1_is_valid_sequence(PROMPT + response)
    assert not valid
    assert reason.startswith(reason_start), reason


def test_state_machine_needs_assistant_marker():
    assert P.searchr1_is_valid_sequence(P.make_prompt("q") + "<think>x</think><answer>y</answer>") == (
        False, "Missing assistant marker")


def test_strip_end_markers():
    assert P.strip_end_markers("<answer>y</answer><|im_end|>\n<|endoftext|>  ") == "<answer>y</answer>"
    assert P.strip_end_markers("<answer>y</answer></s>", markers=["", "</s>"]) == "<answer>y</answer>"
    assert P.strip_end_markers("<answer>y</answer><|im_end|>", markers=[]) == "<answer>y</answer><|im_end|>"
    assert P.strip_end_markers("<|im_end|>x") == "<|im_end|>x"  # only at the end


def test_is_well_formed():
    assert P.is_well_formed(GOOD)
    assert P.is_well_formed("<think> x </think>\n<answer> y </answer><|im_end|>")
    assert P.is_well_formed(GOOD + "<|eot_id|>") and P.is_well_formed(GOOD + "<|im_end|>\n<|endoftext|>")
    assert not P.is_well_formed(GOOD + "<|im_end|>", end_markers=[])
    assert not P.is_well_formed("<think> x </think> junk <answer> y </answer>")
    assert not P.is_well_formed("<answer> y </answer>")
    assert not P.is_well_formed("<think> x </think>\n<search> q </search>")
    assert not P.is_well_formed(GOOD + " trailing words")


# The tiny world's self-check once used this regex; the state machine is the reference, and the two
# disagree on the inputs below.
_OLD_WARMSTART_REGEX = re.compile(
    r"^\s*<think>[^<]*</think>\s*"
    r"(?:<search>[^<]*</search>\s*<information>.*?</information>\s*<think>[^<]*</think>\s*)*"
    r"<answer>[^<]*</answer>\s*(?:<\|im_end\|>)?\s*$",
    re.DOTALL,
)


@pytest.mark.parametrize(("response", "well_formed"), [
    ("<think> a < b </think>\n<answer> y </answer>", True),       # a `<` inside a segment is content
    ("<think> x </think>\n<answer> 3 <4 </answer>", True),
    ("<think> x </think>\n<answer> y </answer><|endoftext|>", True),  # any template's end marker, repeated
    ("<think> x </think>\n<answer> y </answer><|im_end|><|im_end|>", True),
    ("<think> x </think>\n<search> q </search>\n\n<information><think> z </information>\n\n"
     "<think> z </think>\n<answer> y </answer>", False),            # a protocol tag inside an observation
])
def test_grammar_where_the_old_warmstart_regex_disagreed(response, well_formed):
    assert P.is_well_formed(response) is well_formed
    assert (_OLD_WARMSTART_REGEX.match(response) is not None) is not well_formed


_TEXT = st.text(alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Z", "Cc"]), max_size=60)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_normalisation_is_idempotent(text):
    once = P.normalize_answer(text)
    assert P.normalize_answer(once) == once


def _reference_normalize(text: str) -> str:
    """The SQuAD normalisation spelled out step by step (lower → drop punctuation → articles → spaces)."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_normalisation_matches_the_reference_definition(text):
    assert P.normalize_answer(text) == _reference_normalize(text)


def test_tag_segments_cut_text_into_protocol_blocks():
    from searchr1.core.protocol import tag_segments

    text = "a<think> t </think>\n<search>q</search><information>Doc 1(Title: X) y</information>b<answer> z </answer>"
    assert tag_segments(text) == [
        ("a", None), ("<think> t </think>", "think"), ("\n", None), ("<search>q</search>", "search"),
        ("<information>Doc 1(Title: X) y</information>", "information"), ("b", None),
        ("<answer> z </answer>", "answer"),
    ]
    assert "".join(s for s, _ in tag_segments(text)) == text
    assert tag_segments("no tags <think> unclosed") == [("no tags <think> unclosed", None)]
    assert tag_segments("") == []
