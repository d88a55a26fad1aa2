"""The search micro-batcher and the worker's pure helpers (no network)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from searchr1.core.schemas import SamplingParams, Task
from searchr1.core.settings import load_settings
from searchr1.rollout.batcher import SearchBatcher
from searchr1.rollout.sampler import limits_for, sampling_for, score_items
from searchr1.rollout.settings import AgentSettings, RetrieverClientSettings, RolloutSettings


class Backend:
    def __init__(self, fail: bool = False, delay: float = 0.0):
        self.calls: list[list[str]] = []
        self.fail = fail
        self.delay = delay

    async def search(self, queries, top_k=3):
        self.calls.append(list(queries))
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("boom")
        return [[f"{q}#{k}" for k in range(top_k)] for q in queries]


async def test_concurrent_searches_become_one_call_and_each_gets_its_own_hits():
    backend = Backend()
    sizes = []
    b = SearchBatcher(backend, RetrieverClientSettings(top_k=2, max_batch=64, max_wait_ms=20), on_batch=lambda n, s: sizes.append(n))
    results = await asyncio.gather(*[b.search(f"q{i}") for i in range(10)])
    assert backend.calls == [[f"q{i}" for i in range(10)]]
    assert results[3] == ["q3#0", "q3#1"]
    assert sizes == [10]


async def test_max_batch_splits_calls():
    backend = Backend()
    b = SearchBatcher(backend, RetrieverClientSettings(max_batch=4, max_wait_ms=50))
    await asyncio.gather(*[b.search(f"q{i}") for i in range(10)])
    assert sorted(len(c) for c in backend.calls) == [2, 4, 4]
    assert sorted(q for c in backend.calls for q in c) == sorted(f"q{i}" for i in range(10))


async def test_a_failed_call_fails_its_callers_only():
    backend = Backend(fail=True)
    b = SearchBatcher(backend, RetrieverClientSettings(max_wait_ms=0))
    with pytest.raises(RuntimeError, match="boom"):
        await b.search("x")
    backend.fail = False
    assert await b.search("y") == ["y#0", "y#1", "y#2"]


async def test_late_queries_go_in_the_next_batch():
    backend = Backend(delay=0.05)
    b = SearchBatcher(backend, RetrieverClientSettings(max_wait_ms=1))
    first = asyncio.create_task(b.search("a"))
    await asyncio.sleep(0.02)  # first batch in flight
    second = await b.search("b")
    assert await first == ["a#0", "a#1", "a#2"] and second == ["b#0", "b#1", "b#2"]
    assert backend.calls == [["a"], ["b"]]


def test_sampling_prefers_task_values_over_worker_defaults():
    agent = AgentSettings(temperature=0.8, top_p=0.95, max_tokens_per_turn=64, extra_args={"a": 1})
    plain = Task(task_id="t", question="q")
    s = sampling_for(plain, agent)
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.extra_args) == (0.8, 0.95, -1, None, {"a": 1})
    custom = Task(task_id="t", question="q",
                  sampling=SamplingParams(temperature=0.3, top_k=5, seed=9, max_tokens_per_turn=32))
    s = sampling_for(custom, agent)
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.3, 0.95, 5, 9)
    assert limits_for(custom, agent).max_tokens_per_turn == 32
    assert limits_for(plain, agent).max_tokens_per_turn == 64


def test_score_items_shapes():
    task = Task(task_id="t", question="q", golden_answers=["Paris", "paris"])
    a = score_items(task, "P:", ["r1", "r2"], [1, 0], "solution_str")
    assert a == [{"solution_str": "P:r1", "ground_truth": {"target": ["Paris", "paris"]}},
                 {"solution_str": "P:r2", "ground_truth": {"target": ["Paris", "paris"]}}]
    b = score_items(task, "P:", ["r1"], [2], "prompt_response")
    assert b == [{"prompt": "P:", "response": "r1", "golden_answers": ["Paris", "paris"], "num_searches": 2}]


def test_settings_from_toml_and_env(tmp_path, monkeypatch):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[rollout]\nmodel = "m"\n[rollout.agent]\nmax_turns = 2\n[rollout.retriever]\n'
                   'addresses = ["h:1"]\n')
    monkeypatch.setenv("ROLLOUT_AGENT__MAX_OBS_TOKENS", "77")
    s = load_settings(RolloutSettings, cfg)
    assert (s.model, s.agent.max_turns, s.agent.max_obs_tokens, s.retriever.addresses) == ("m", 2, 77, ["h:1"])
    with pytest.raises(ValidationError):
        RolloutSettings(agent={"max_turnz": 1})


async def test_blank_queries_get_no_hits_without_a_call_and_long_ones_are_cut():
    backend = Backend()
    b = SearchBatcher(backend, RetrieverClientSettings(top_k=1, max_wait_ms=10, max_query_chars=5))
    blank, spaces, long, ok = await asyncio.gather(b.search(""), b.search("   "), b.search("abcdefghij"), b.search(" q "))
    assert blank == [] and spaces == []
    assert backend.calls == [["abcde", "q"]]
    assert long == ["abcde#0"] and ok == ["q#0"]
