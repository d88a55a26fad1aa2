"""How `VllmGenerator` stops a turn: stop strings that are single tokens of the model's tokenizer (the
Search-R1 tags as added tokens) are also given to vLLM as stop token ids, so the engine core ends the
request at the step that sampled the tag; a multi-token tag (Qwen2.5's, SmolLM2's) stays a text match only.
The finish of a turn is "stop" with the stop string whichever way vLLM reports it. The KV block size
setting defaults to the platform's choice (`vllm_engine.CPU_BLOCK_SIZE` on CPU)."""

from __future__ import annotations

import pytest

from searchr1.core.protocol import STOP_STRINGS
from searchr1.rollout.settings import EngineSettings
from searchr1.rollout.vllm_engine import CPU_BLOCK_SIZE, VllmGenerator, single_token_stops
from tests.support.real_models import tokenizer
from tests.support.tiny_lm import build_tokenizer


def test_single_token_tags_map_to_their_ids():
    tok = build_tokenizer()
    stops = single_token_stops(tok, (*STOP_STRINGS, "Paris is"))
    assert stops == {s: tok.convert_tokens_to_ids(s) for s in STOP_STRINGS}
    assert all(tok.decode([i]) == s for s, i in stops.items())


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-tokenizer"])
def test_multi_token_tags_stay_text_matches(name):
    tok = tokenizer(name)
    assert all(len(tok.encode(s, add_special_tokens=False)) > 1 for s in STOP_STRINGS)
    assert single_token_stops(tok, STOP_STRINGS) == {}


def test_a_turn_stopped_by_a_tag_finishes_stop_with_the_string_however_vllm_reports_it():
    gen = VllmGenerator(engine=None, eos_token_ids=[2], stop_ids={"</search>": 504, "</answer>": 508})
    assert gen._stop_of("</search>", STOP_STRINGS) == ("stop", "</search>")  # matched as text
    assert gen._stop_of(508, STOP_STRINGS) == ("stop", "</answer>")  # matched as a stop token id
    assert gen._stop_of(None, STOP_STRINGS) == ("eos", None)  # EOS
    assert gen._stop_of(2, STOP_STRINGS) == ("eos", None)  # another stop id
    assert gen._stop_of(504, ("</answer>",)) == ("eos", None)  # not a stop string of this turn
    text_only = VllmGenerator(engine=None, eos_token_ids=[2])
    assert text_only._stop_of(504, STOP_STRINGS) == ("eos", None)


def test_block_size_defaults_to_the_platform_choice_and_is_bounded():
    assert EngineSettings().block_size is None
    assert EngineSettings(block_size=128).block_size == 128
    assert CPU_BLOCK_SIZE % 32 == 0  # vLLM 0.32's CPU attention accepts multiples of 32 only
    with pytest.raises(ValueError):
        EngineSettings(block_size=8)
