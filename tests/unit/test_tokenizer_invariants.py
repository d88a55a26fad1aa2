"""The agent loop with real byte-level BPE tokenizers (SmolLM2-135M's and Qwen2.5's, prepared once per
machine by `searchr1 models prepare`): what the learner trains on is exactly what the engine sampled plus
the observation's ids as the engine saw them, whatever BPE would merge across the protocol's tags.

The generator here behaves as vLLM does with stop strings: it emits the ids of the model's text one at a
time, decodes the running text after each, and stops at the first id whose text completes a stop string
(the ids keep that whole token, the text is cut after the stop string) or at EOS."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from searchr1.core.protocol import (
    SEARCH_R1_TEMPLATE,
    STOP_STRINGS,
    is_well_formed,
    make_prompt,
    observation_for,
    render_prompt,
)
from searchr1.rollout.agent import AgentLimits, run_trajectory
from searchr1.rollout.engine import HfCodec, TurnOutput, TurnRequest
from searchr1.rollout.settings import AgentSettings
from tests.support.real_models import tokenizer

TOKENIZERS = ["smollm2-135m", "qwen2.5-tokenizer"]
QUESTION = "what is the capital of france"
DOCS = ["France\nParis is the capital of France.", "Lyon\nLyon is a city on the Rhône."]


@dataclass
class BpeGenerator:
    """Turn k emits `texts[k]` tokenised by the real tokenizer, stopping as vLLM does."""

    tok: object
    texts: list[str]
    requests: list[TurnRequest] = field(default_factory=list)
    returned: list[list[int]] = field(default_factory=list)

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        self.requests.append(request)
        planned = self.tok.encode(self.texts[len(self.requests) - 1], add_special_tokens=False)
        ids: list[int] = []
        for tid in planned[: request.max_tokens]:
            ids.append(tid)
            if tid == self.tok.eos_token_id:
                self.returned.append(ids)
                return TurnOutput(ids, [-0.5] * len(ids), self.tok.decode(ids, skip_special_tokens=True), "eos")
            text = self.tok.decode(ids, skip_special_tokens=True)
            hit = next((s for s in request.stop if s in text), None)
            if hit is not None:
                cut = text[: text.index(hit) + len(hit)]
                self.returned.append(ids)
                return TurnOutput(ids, [-0.5] * len(ids), cut, "stop", hit)
        self.returned.append(ids)
        return TurnOutput(ids, [-0.5] * len(ids), self.tok.decode(ids, skip_special_tokens=True), "length")

    async def reload(self, weights_path: str, digest=None) -> None:
        pass

    async def close(self) -> None:
        pass


@dataclass(frozen=True)
class Hit:
    contents: str


async def _search(query: str):
    return [Hit(d) for d in DOCS]


def _rollout(name: str, texts: list[str]):
    tok = tokenizer(name)
    codec = HfCodec(tok)
    prompt_ids = codec.encode(render_prompt(QUESTION, tok))
    gen = BpeGenerator(tok, texts)
    res = asyncio.run(run_trajectory(prompt_ids, gen, codec, _search, AgentLimits.from_settings(AgentSettings(max_turns=3))))
    return tok, codec, gen, res


def _spans(mask: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, value) runs of equal mask values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


# the search turn goes on after `</search>` with text that Qwen's BPE merges into the closing `>`
# (`>The`), as a model that has not learnt to stop would write it
SEARCH_TURN = "<think>I need to look this up.</think>\n<search> capital of France </search>The answer"
ANSWER_TURN = "<think>Paris is the capital.</think>\n<answer> Paris </answer>"


@pytest.mark.parametrize("name", TOKENIZERS)
def test_trained_ids_are_sampled_ids_plus_observation_ids(name):
    tok, codec, gen, res = _rollout(name, [SEARCH_TURN, ANSWER_TURN])
    assert res.finish_reason == "answer" and res.answer == "Paris" and res.num_searches == 1
    obs_ids = codec.encode(observation_for(DOCS))
    assert res.response_ids == gen.returned[0] + obs_ids + gen.returned[1]
    assert res.loss_mask == [1] * len(gen.returned[0]) + [0] * len(obs_ids) + [1] * len(gen.returned[1])
    # what the engine saw on every turn is the prompt plus exactly the trained ids before it
    assert list(gen.requests[0].prompt_ids) == res.prompt_ids
    assert list(gen.requests[1].prompt_ids) == res.prompt_ids + gen.returned[0] + obs_ids
    assert tuple(gen.requests[0].stop) == STOP_STRINGS
    assert len(res.behavior_logprobs) == len(res.response_ids)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_search_stop_inside_a_merged_token_stops_and_is_never_resplit(name):
    tok, codec, gen, res = _rollout(name, [SEARCH_TURN, ANSWER_TURN])
    first = gen.returned[0]
    last = tok.decode(first[-1:])
    assert tok.decode(first).endswith(last) and "</search>" in tok.decode(first)
    assert "</search>" not in tok.decode(first[:-1])  # stopped at the token that completed the tag
    if name == "qwen2.5-tokenizer":
        assert last == ">The"  # BPE merged the tag's `>` with the next word: the stop still fired
    assert res.response_ids[: len(first)] == first
    # a turn that ends exactly at `</search>`: re-tokenising the decoded response would split it
    # differently (Qwen merges the tag's `>` with the observation's `\n\n`); the trained ids are the
    # sampled ones and the observation's own, never a re-tokenisation
    tok, codec, gen, res = _rollout(name, [SEARCH_TURN[: SEARCH_TURN.index("The answer")], ANSWER_TURN])
    assert tok.decode(gen.returned[0][-1:]) == ">"
    assert res.response_ids[: len(gen.returned[0])] == gen.returned[0]
    if name == "qwen2.5-tokenizer":
        assert codec.encode(codec.decode(res.response_ids)) != res.response_ids


@pytest.mark.parametrize("name", TOKENIZERS)
def test_information_mask_is_exact_at_both_edges(name):
    tok, codec, gen, res = _rollout(name, [SEARCH_TURN, ANSWER_TURN])
    spans = _spans(res.loss_mask)
    assert [v for _, _, v in spans] == [1, 0, 1]
    (_, a, _), (b0, b1, _), (c0, _, _) = spans
    obs_text = codec.decode(res.response_ids[b0:b1])
    assert obs_text == observation_for(DOCS)
    assert obs_text.startswith("\n\n<information>") and obs_text.endswith("</information>\n\n")
    # the tokens on either side are the model's own: the last of the search turn, the first of the next
    assert res.response_ids[a - 1] == gen.returned[0][-1]
    assert res.response_ids[c0] == gen.returned[1][0]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_prompt_bytes_are_search_r1s_with_and_without_a_chat_template(name):
    tok = tokenizer(name)
    codec = HfCodec(tok)
    content = SEARCH_R1_TEMPLATE.format(question=QUESTION + "?")
    assert make_prompt(QUESTION) == content
    chat = render_prompt(QUESTION, tok)  # instruct: the chat template around Search-R1's bytes
    assert chat.count(content) == 1
    assert chat.endswith(content + "<|im_end|>\n<|im_start|>assistant\n")
    assert render_prompt(QUESTION, None) == content  # base: the bare bytes
    for text in (chat, content):
        assert codec.decode(codec.encode(text)) == text  # the ids the engine gets decode to those bytes
    assert tok.bos_token_id is None or codec.encode(content)[0] != tok.bos_token_id


@pytest.mark.parametrize("name", TOKENIZERS)
def test_end_of_turn_token_ends_the_trajectory(name):
    tok = tokenizer(name)
    assert tok.eos_token == "<|im_end|>"
    _, codec, gen, res = _rollout(name, ["<think>I think I know.</think>" + tok.eos_token, ANSWER_TURN])
    assert res.finish_reason == "eos" and res.num_turns == 1 and len(gen.requests) == 1
    assert res.response_ids[-1] == tok.eos_token_id and res.loss_mask[-1] == 1
    # an answer followed by the end-of-turn token is well formed (the marker is ignored)
    _, codec, gen, res = _rollout(name, [ANSWER_TURN + tok.eos_token])
    assert res.finish_reason == "answer"
    assert is_well_formed(codec.decode(res.response_ids) + tok.eos_token)
