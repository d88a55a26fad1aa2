"""The agent loop against a scripted fake generator and a fake retriever (no model, no network)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from searchr1.core.protocol import INVALID_ACTION_MESSAGE, STOP_STRINGS, observation_for
from searchr1.core.schemas import Trajectory
from searchr1.rollout.agent import OBS_CLOSE, AgentLimits, Sampling, run_trajectory, truncate_observation
from searchr1.rollout.engine import TurnOutput, TurnRequest
from searchr1.rollout.settings import AgentSettings


class CharCodec:
    """Environment text ↔ ids: one id per character (ord)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) if i < 0x110000 else "?" for i in ids)


@dataclass
class ScriptedGenerator:
    """Answers turn k with script[k] = (text, finish). Its ids are NOT the codec's encoding of the text
    (they count up from 70_000), so a loop that re-tokenised text would be caught."""

    script: list[tuple[str, str]]
    requests: list[TurnRequest] = field(default_factory=list)
    returned: list[list[int]] = field(default_factory=list)
    next_id: int = 70_000

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        turn = len(self.requests)
        self.requests.append(request)
        text, finish = self.script[min(turn, len(self.script) - 1)]
        n = min(max(1, len(text) // 4), request.max_tokens)
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        self.returned.append(ids)
        lps = [-0.01 * (k + 1) for k in range(n)]
        return TurnOutput(ids, lps, text, finish, "</search>" if finish == "stop" else None)

    async def reload(self, weights_path: str, digest=None) -> None:
        pass

    async def close(self) -> None:
        pass


@dataclass(frozen=True)
class FakeHit:
    contents: str


@dataclass
class FakeSearch:
    hits: list[FakeHit] = field(default_factory=lambda: [FakeHit("Paris\nParis is the capital of France."),
                                                          FakeHit("Lyon\nLyon is a city.")])
    queries: list[str] = field(default_factory=list)
    fail: bool = False

    async def __call__(self, query: str):
        self.queries.append(query)
        if self.fail:
            raise RuntimeError("retriever down")
        return self.hits


PROMPT = [1, 2, 3]
SEARCH = ("<think>need info</think><search> capital of france </search>", "stop")
ANSWER = ("<think>ok</think><answer> Paris </answer>", "stop")



def limits(max_context_tokens: int | None = None, **agent) -> AgentLimits:
    """The limits of `AgentSettings(**agent)`."""
    return AgentLimits.from_settings(AgentSettings(**agent), max_context_tokens=max_context_tokens)


def _sampled(res, gen):
    return [t for t, m in zip(res.response_ids, res.loss_mask) if m == 1]


def _env(res):
    return [t for t, m in zip(res.response_ids, res.loss_mask) if m == 0]


def _check_invariants(res):
    Trajectory(prompt_ids=res.prompt_ids, response_ids=res.response_ids, loss_mask=res.loss_mask,
               behavior_logprobs=res.behavior_logprobs)
    assert all(lp == 0.0 for lp, m in zip(res.behavior_logprobs, res.loss_mask) if m == 0)
    assert all(lp < 0 for lp, m in zip(res.behavior_logprobs, res.loss_mask) if m == 1)


async def test_answer_on_first_turn():
    gen, search = ScriptedGenerator([ANSWER]), FakeSearch()
    res = await run_trajectory(PROMPT, gen, CharCodec(), search, limits(max_turns=3))
    assert res.finish_reason == "answer" and res.answer == "Paris"
    assert res.num_turns == 1 and res.num_searches == 0 and search.queries == []
    assert res.response_ids == gen.returned[0]
    assert res.loss_mask == [1] * len(gen.returned[0])
    assert res.behavior_logprobs == pytest.approx([-0.01 * (k + 1) for k in range(len(gen.returned[0]))])
    assert list(gen.requests[0].stop) == list(STOP_STRINGS)
    _check_invariants(res)


async def test_search_then_answer_masks_exactly_the_observation():
    gen, search, codec = ScriptedGenerator([SEARCH, ANSWER]), FakeSearch(), CharCodec()
    res = await run_trajectory(PROMPT, gen, codec, search, limits(max_turns=3))
    obs = codec.encode(observation_for([h.contents for h in search.hits]))
    assert search.queries == ["capital of france"]
    assert res.finish_reason == "answer" and res.num_turns == 2 and res.num_searches == 1
    assert res.response_ids == gen.returned[0] + obs + gen.returned[1]
    assert res.loss_mask == [1] * len(gen.returned[0]) + [0] * len(obs) + [1] * len(gen.returned[1])
    # the second turn's prompt is the token ids so far, not re-tokenised text
    assert list(gen.requests[1].prompt_ids) == PROMPT + gen.returned[0] + obs
    assert _sampled(res, gen) == gen.returned[0] + gen.returned[1]
    assert _env(res) == obs
    assert res.env_tokens == len(obs) and res.generated_tokens == len(gen.returned[0]) + len(gen.returned[1])
    _check_invariants(res)


async def test_always_search_hits_max_turns_then_a_final_turn_that_cannot_search():
    gen, search = ScriptedGenerator([SEARCH]), FakeSearch()
    res = await run_trajectory(PROMPT, gen, CharCodec(), search, limits(max_turns=2))
    assert len(gen.requests) == 3  # two search turns + the final answer-only turn
    assert len(search.queries) == 2  # the final turn's search is not executed
    assert res.num_turns == 3 and res.num_searches == 2
    assert res.finish_reason == "max_turns"
    assert res.response_ids[-len(gen.returned[2]):] == gen.returned[2]  # no observation after the final turn
    _check_invariants(res)


async def test_final_turn_may_answer():
    gen, search = ScriptedGenerator([SEARCH, ANSWER]), FakeSearch()
    res = await run_trajectory(PROMPT, gen, CharCodec(), search, limits(max_turns=1))
    assert res.finish_reason == "answer" and res.num_turns == 2 and res.num_searches == 1


async def test_max_turns_zero_is_one_answer_only_turn():
    gen, search = ScriptedGenerator([SEARCH]), FakeSearch()
    res = await run_trajectory(PROMPT, gen, CharCodec(), search, limits(max_turns=0))
    assert res.num_turns == 1 and search.queries == [] and res.finish_reason == "max_turns"


async def test_invalid_action_appends_the_invalid_message_with_mask_zero():
    # a turn cut by its own token budget without any action, then a closing tag with no opening tag
    gen = ScriptedGenerator([("<think>rambling on and on", "length"), ("just text </search>", "stop"), ANSWER])
    codec, search = CharCodec(), FakeSearch()
    res = await run_trajectory(PROMPT, gen, codec, search, limits(max_turns=4, max_tokens_per_turn=5))
    msg = codec.encode(INVALID_ACTION_MESSAGE)
    assert res.response_ids == gen.returned[0] + msg + gen.returned[1] + msg + gen.returned[2]
    assert _env(res) == msg + msg
    assert res.num_searches == 0 and search.queries == [] and res.num_turns == 3
    assert res.finish_reason == "answer"
    _check_invariants(res)


async def test_observation_truncation_keeps_the_closing_tag_and_is_counted():
    codec = CharCodec()
    long_hit = FakeHit("Title\n" + "x" * 500)
    gen, search = ScriptedGenerator([SEARCH, ANSWER]), FakeSearch(hits=[long_hit])
    res = await run_trajectory(PROMPT, gen, codec, search, limits(max_turns=2, max_obs_tokens=60))
    env = _env(res)
    assert len(env) == 60
    assert codec.decode(env).endswith(OBS_CLOSE)
    assert codec.decode(env).startswith("\n\n<information>Doc 1(Title: Title) xxx")
    assert res.obs_truncations == 1
    _check_invariants(res)


def test_truncate_observation_pure():
    close = [8, 9]
    assert truncate_observation([1, 2, 3], close, 3) == ([1, 2, 3], False)
    assert truncate_observation([1, 2, 3, 4, 5, 8, 9], close, 5) == ([1, 2, 3, 8, 9], True)
    assert truncate_observation([1, 2, 3, 4, 8, 9], close, 1) == ([1], True)


async def test_response_budget_ends_with_length():
    gen, search = ScriptedGenerator([SEARCH]), FakeSearch()
    budget = limits(max_turns=10, max_tokens_per_turn=100, max_response_tokens=40)
    res = await run_trajectory(PROMPT, gen, CharCodec(), search, budget)
    assert res.finish_reason == "length"
    assert len(res.response_ids) <= 40
    # each turn asked for at most what was left of the budget
    used = 0
    for req, ids in zip(gen.requests, gen.returned):
        assert req.max_tokens <= 40 - used
        used = len(req.prompt_ids) - len(PROMPT) + len(ids)
    _check_invariants(res)


async def test_eos_without_action_ends_the_trajectory():
    gen, search = ScriptedGenerator([("<think>I give up</think>", "eos")]), FakeSearch()
    res = await run_trajectory(PROMPT, gen, CharCodec(), search, limits(max_turns=3))
    assert res.finish_reason == "eos" and res.num_turns == 1 and res.env_tokens == 0


async def test_search_failure_ends_with_error():
    gen, search = ScriptedGenerator([SEARCH, ANSWER]), FakeSearch(fail=True)
    res = await run_trajectory(PROMPT, gen, CharCodec(), search, limits(max_turns=3))
    assert res.finish_reason == "error" and "retriever down" in res.error
    assert res.response_ids == gen.returned[0]


async def test_seeds_differ_per_turn_and_sampling_is_passed_through():
    gen, search = ScriptedGenerator([SEARCH, ANSWER]), FakeSearch()
    s = Sampling.from_settings(AgentSettings(extra_args={"k": 1}), seed=11, temperature=0.7, top_p=0.9, top_k=20)
    await run_trajectory(PROMPT, gen, CharCodec(), search, limits(), s)
    r0, r1 = gen.requests
    assert (r0.temperature, r0.top_p, r0.top_k, r0.extra_args) == (0.7, 0.9, 20, {"k": 1})
    assert r0.seed == 11 and r1.seed != r0.seed


async def test_a_trajectory_waiting_on_search_does_not_block_another():
    release = asyncio.Event()

    class SlowSearch(FakeSearch):
        async def __call__(self, query):
            await release.wait()
            return await super().__call__(query)

    slow_gen, fast_gen = ScriptedGenerator([SEARCH, ANSWER]), ScriptedGenerator([SEARCH, SEARCH, ANSWER])
    slow = asyncio.create_task(run_trajectory(PROMPT, slow_gen, CharCodec(), SlowSearch(), limits()))
    fast = await asyncio.wait_for(run_trajectory(PROMPT, fast_gen, CharCodec(), FakeSearch(), limits()), 5)
    assert fast.finish_reason == "answer" and fast.num_searches == 2
    assert not slow.done()
    release.set()
    assert (await slow).finish_reason == "answer"


async def test_context_length_bounds_every_turn():
    gen, search = ScriptedGenerator([SEARCH]), FakeSearch()
    context = limits(max_turns=10, max_tokens_per_turn=100, max_response_tokens=10_000, max_context_tokens=60)
    res = await run_trajectory(PROMPT, gen, CharCodec(), search, context)
    assert res.finish_reason == "length"
    assert len(res.prompt_ids) + len(res.response_ids) <= 60
    assert all(len(r.prompt_ids) + r.max_tokens <= 60 for r in gen.requests)


def test_a_tag_opened_by_the_prompt_counts_for_the_first_turn():
    gen = ScriptedGenerator([(" capital of france </search>", "stop"), ANSWER])
    search = FakeSearch()
    res = asyncio.run(run_trajectory(PROMPT, gen, CharCodec(), search, limits(max_turns=3),
                                     opened="<think>x</think><search>"))
    assert search.queries == ["capital of france"] and res.num_searches == 1 and res.answer == "Paris"
    # without it the same turn is an invalid action
    gen = ScriptedGenerator([(" capital of france </search>", "stop"), ANSWER])
    res = asyncio.run(run_trajectory(PROMPT, gen, CharCodec(), FakeSearch(), limits(max_turns=3)))
    assert res.num_searches == 0 and res.answer == "Paris"
