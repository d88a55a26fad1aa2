"""Arbitrary text through the protocol parser and answer extraction, arbitrary bytes through the stream
decoder: nothing but the documented results and `SchemaError` ever comes out."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.core import protocol
from searchr1.core.schemas import (
    SCHEMA_VERSION,
    SchemaError,
    Task,
    Trajectory,
    TrajectoryGroup,
    decode,
    encode,
)

TAGS = ["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<information>",
        "</information>", "<|im_start|>", "<|im_end|>", "assistant\n", "Doc 1(Title: ", "\n", " "]
"""Fragments the parsers look for: mixing them into random text reaches their rarer branches."""

tagged_text = st.lists(st.one_of(st.sampled_from(TAGS), st.text(max_size=20)), max_size=30).map("".join)
any_text = st.one_of(st.text(max_size=400), tagged_text)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(any_text)
def test_protocol_parsers_accept_any_text(text):
    action = protocol.parse_action(text)
    assert action.kind in (None, "search", "answer") and isinstance(action.content, str)
    for extract in (protocol.searchr1_extract_solution, protocol.extract_answer):
        got = extract(text)
        assert got is None or isinstance(got, str)
    assert isinstance(protocol.normalize_answer(text), str)
    assert all(isinstance(b, str) for b in protocol.information_blocks(text))
    assert protocol.count_searches(text) >= 0
    for ok, reason in (protocol.check_tag_sequence(text), protocol.searchr1_is_valid_sequence(text)):
        assert isinstance(ok, bool) and isinstance(reason, str)
    assert isinstance(protocol.strip_end_markers(text), str)
    assert isinstance(protocol.is_well_formed(text), bool)
    title, body = protocol.split_contents(text)
    assert isinstance(title, str) and isinstance(body, str)


@SETTINGS
@given(st.lists(st.one_of(st.text(max_size=200), st.fixed_dictionaries({"contents": st.text(max_size=200)})),
                max_size=5))
def test_observation_of_any_documents_is_wrapped(docs):
    obs = protocol.observation_for(docs)
    assert obs.startswith("\n\n<information>") and obs.endswith("</information>\n\n")


DECODE_TO = [Task, Trajectory, TrajectoryGroup]

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=30)
    | st.binary(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)


def assert_decode_refuses_or_parses(raw: bytes) -> None:
    for cls in DECODE_TO:
        try:
            value = decode(cls, raw)
        except SchemaError as exc:
            assert str(exc)  # a clear reason for the dead-letter entry
        else:
            assert isinstance(value, cls)


@SETTINGS
@given(st.binary(max_size=512))
def test_decoder_turns_any_bytes_into_a_schema_error(raw):
    assert_decode_refuses_or_parses(raw)


@SETTINGS
@given(st.one_of(msgpack_values, st.fixed_dictionaries(
    {"v": st.one_of(st.just(SCHEMA_VERSION), msgpack_values),
     "kind": st.one_of(st.sampled_from([c.__name__ for c in DECODE_TO]), msgpack_values),
     "data": st.one_of(msgpack_values, st.dictionaries(
         st.sampled_from(["task_id", "question", "golden_answers", "trajectories", "prompt_ids",
                          "response_ids", "loss_mask", "behavior_logprobs", "reward", "policy_version"]),
         msgpack_values, max_size=6))})))
def test_decoder_turns_any_msgpack_envelope_into_a_schema_error(obj):
    assert_decode_refuses_or_parses(msgpack.packb(obj, use_bin_type=True))


@pytest.mark.parametrize("raw", [
    msgpack.packb([[[[[[[[[[]]]]]]]]]] * 3),
    b"\xdd\xff\xff\xff\xff",  # an array header claiming 4 G elements
    b"\xdf\xff\xff\xff\xff",  # a map header claiming 4 G pairs
    b"\xc7\xff\xff\xff\xff",  # a truncated ext
    msgpack.packb({"v": SCHEMA_VERSION, "kind": "Task", "data": {1: 2}}, strict_types=False),
    b"\x91" * 100_000 + b"\xc0",  # 100 000 nested arrays
])
def test_decoder_refuses_hostile_shapes(raw):
    assert_decode_refuses_or_parses(raw)


def test_truncated_payloads_refused():
    raw = encode(Task(task_id="t", question="q?", golden_answers=["a"]))
    for cut in range(len(raw)):
        with pytest.raises(SchemaError):
            decode(Task, raw[:cut])
