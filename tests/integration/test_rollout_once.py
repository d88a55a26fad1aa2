"""`searchr1 rollout once` samples with the worker's `RolloutSettings`: the transformers engine on the tiny
model, the real retriever (BM25 over gRPC on loopback), and the agent limits and sampling of the settings
(a turn budget of 6 tokens, a response budget of 20, seeded sampling that reproduces)."""

from __future__ import annotations

import json

import pytest

from searchr1.retriever.builder import build_index
from searchr1.retriever.loading import load_index
from searchr1.retriever.server import start_retriever
from searchr1.retriever.settings import RetrieverSettings
from searchr1.rollout.settings import RolloutSettings
from searchr1.rollout.tools.once import OnceRequest, sample_once
from tests.support.tiny_lm import build_tiny_lm


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("once")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{t} is a word.'}) + "\n"
                              for i, t in enumerate(["Moon", "Nile", "Chess"])))
    build_index(corpus, root / "bm25", "bm25")
    return build_tiny_lm(root / "model"), root / "bm25"


async def test_once_reads_engine_agent_and_retriever_from_the_settings(world):
    model, index = world
    running = await start_retriever(RetrieverSettings(grpc_port=0, http_port=None, index=index),
                                    load_index(index, encoder_factory=None))
    try:
        settings = RolloutSettings(
            model=str(model), engine={"kind": "hf"}, retriever={"addresses": [running.grpc_address], "top_k": 2},
            agent={"max_turns": 1, "max_tokens_per_turn": 6, "max_response_tokens": 20, "temperature": 0.8})
        prompt, response, res = await sample_once(OnceRequest("what is the moon", settings, seed=5, steer=False))
        again = await sample_once(OnceRequest("what is the moon", settings, seed=5, steer=False))
    finally:
        await running.stop()
    assert "what is the moon?" in prompt and "<search>" in prompt  # Search-R1's template, question completed
    assert 1 <= res.num_turns <= 2 and res.generated_tokens <= 6 * res.num_turns
    assert len(res.response_ids) <= 20
    assert (again[1], again[2].response_ids) == (response, res.response_ids)
