"""`searchr1 eval`'s pipeline end to end on real components: vLLM (CPU build) on the tiny random Qwen2, a
real BM25 retriever over gRPC (through the `SearchBatcher`), the real reward service over HTTP — on a
Search-R1-shaped test parquet the test writes (4 questions, two data_sources, question types).

The random model scores ~0; the test asserts structure and counts: every question has one greedy and K
sampled records, searches happened (the model is steered into the turn structure by the `SearchSteering`
logits processor, as in the rollout worker test), greedy is deterministic, both files carry the expected
keys. One engine serves the module; `evaluate` is what the `eval` command runs after starting its engine.
"""

from __future__ import annotations

import json

import pytest
import pytest_asyncio

from searchr1.core.clients.retriever import RetrieverClient
from searchr1.core.clients.reward import RewardClient
from searchr1.core.protocol import make_prompt
from searchr1.rollout.batcher import SearchBatcher
from searchr1.rollout.engine import HfCodec
from searchr1.rollout.evaluation.evaluate import EvalConfig, evaluate
from searchr1.rollout.evaluation.stats import METRICS
from searchr1.rollout.settings import AgentSettings, EvalSettings, RetrieverClientSettings
from searchr1.rollout.tools.steering import steer_args, word_tokens
from tests.support.rollout_stack import QUESTIONS, start_retriever, start_reward, start_vllm
from tests.support.tiny_lm import build_tiny_lm

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-eval") / "v0")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(model_dir, tmp_path_factory):
    gen = await start_vllm(model_dir, max_num_seqs=64)
    retriever = await start_retriever(tmp_path_factory.mktemp("retriever-eval"))
    reward = await start_reward()
    yield gen, retriever, reward
    await reward.stop()
    await retriever.stop()
    await gen.close()


def _test_parquet(path, n: int = 4):
    """Search-R1 rows (`nq_search.py` shape) with our world's extra_info."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, (q, golds) in enumerate(QUESTIONS[:n]):
        q = q + "?"
        rows.append({
            "id": f"test_{i}", "question": q, "golden_answers": golds,
            "data_source": "world_known_single_hop" if i % 2 == 0 else "world_unknown_single_hop",
            "prompt": [{"role": "user", "content": make_prompt(q)}], "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
            "extra_info": {"split": "test", "index": i, "question_type": "capital" if i < 2 else "other",
                           "entity_kind": "city", "knowledge": "known" if i % 2 == 0 else "unknown"},
        })
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


async def _run(stack, data, out, samples: int, seed: int = 0):
    gen, retriever, reward = stack
    tokenizer = gen.tokenizer()
    client = RetrieverClient([retriever.address])
    batcher = SearchBatcher(client, RetrieverClientSettings(top_k=2, max_wait_ms=2))
    extra = steer_args(tokenizer, p_search=0.8, max_searches=2, search_tokens=word_tokens(tokenizer))
    agent = AgentSettings(max_turns=2, max_tokens_per_turn=48, max_obs_tokens=120, max_response_tokens=600,
                          temperature=1.0, extra_args=extra)
    groups = EvalSettings(group_by=["data_source", "question_type", "entity_kind", "knowledge"])
    config = EvalConfig.from_settings(agent, groups, seed=seed, max_context_tokens=4096, samples=samples,
                                      concurrency=4)
    try:
        async with RewardClient(reward.url) as scorer:
            return await evaluate(data, out, gen, HfCodec(tokenizer), tokenizer, batcher.search, scorer, config,
                                  meta={"model": "tiny-random"})
    finally:
        await client.close()


async def test_eval_end_to_end_writes_both_files(stack, tmp_path):
    data = _test_parquet(tmp_path / "test.parquet")
    run = await _run(stack, data, tmp_path / "out", samples=2)

    doc = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert set(doc) == {"meta", "summary", "records"}
    assert doc["meta"]["questions"] == 4 and doc["meta"]["samples"] == 2 and doc["meta"]["model"] == "tiny-random"
    records = doc["records"]
    assert len(records) == 4 * 3
    by_q: dict[str, list[dict]] = {}
    for r in records:
        by_q.setdefault(r["qid"], []).append(r)
    assert sorted(by_q) == [f"test_{i}" for i in range(4)]
    assert all(sorted((r["mode"], r["sample"]) for r in rs) == [("greedy", 0), ("sampled", 0), ("sampled", 1)]
               for rs in by_q.values())
    for r in records:
        assert r["response"] and r["response_tokens"] > 0 and r["num_turns"] >= 1
        assert r["finish_reason"] in ("answer", "max_turns", "eos", "length")
        for key in ("em", "f1", "searchr1_em", "format_valid"):
            assert 0.0 <= r[key] <= 1.0
        assert r["response"].count("<information>") >= r["num_searches"]
    assert sum(r["num_searches"] for r in records) > 0, "the steered model never searched"

    summary = doc["summary"]
    assert set(summary) == {"greedy", "sampled"}
    assert summary["greedy"]["overall"]["trajectories"] == 4 and summary["sampled"]["overall"]["trajectories"] == 8
    for mode in summary.values():
        assert {k for k, _ in METRICS} <= set(mode["overall"])
        assert set(mode["by"]) == {"data_source", "question_type", "entity_kind", "knowledge"}
        assert set(mode["by"]["data_source"]) == {"world_known_single_hop", "world_unknown_single_hop"}
        assert set(mode["by"]["knowledge"]) == {"known", "unknown"}
        assert sum(g["questions"] for g in mode["by"]["question_type"].values()) == 4
    g = summary["greedy"]["overall"]
    assert g["searches"] == pytest.approx(sum(r["num_searches"] for r in records if r["mode"] == "greedy") / 4)

    md = (tmp_path / "out" / "eval.md").read_text()
    for heading in ("# Evaluation", "## Greedy (temperature 0)", "## Sampled (temperature 1.0, 2 per question)",
                    "### by data_source", "### by knowledge"):
        assert heading in md
    assert run.document == doc

    # greedy is deterministic: a second run (other sampling seed, no samples) gives the same greedy responses
    again = await _run(stack, data, tmp_path / "again", samples=0, seed=5)
    assert [r.response for r in again.records] == [r["response"] for r in records if r["mode"] == "greedy"]
    assert set(again.document["summary"]) == {"greedy"}
