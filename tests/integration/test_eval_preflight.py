"""`searchr1 eval` checks the retriever and the reward service before any engine starts: a token the
retriever refuses, a retriever that does not answer, a token the reward service refuses each end the command
with exit 1 and one line naming the setting to fix; with the services and token of a run directory's
connection file the evaluation runs (the transformers engine on the tiny model) and its eval.json carries
the setting fingerprint (the index's corpus and digest from the retriever's `Info`, top-k, template,
limits, the metric set) and the failure counts."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from typer.testing import CliRunner

from searchr1.core.run_connection import RunConnection, write_connection
from tests.support.rollout_stack import QUESTIONS, write_corpus
from tests.support.tiny_lm import build_tiny_lm

TOKEN = "preflight-token"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
async def services(tmp_path):
    """A BM25 retriever (gRPC) and the reward service on loopback, both behind TOKEN."""
    from searchr1.core.servers import HttpServer
    from searchr1.retriever.builder import build_index
    from searchr1.retriever.server import open_index, start_retriever
    from searchr1.retriever.settings import RetrieverSettings
    from searchr1.reward.app import build_service, create_app
    from searchr1.reward.settings import RewardSettings

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    await asyncio.to_thread(build_index, corpus, tmp_path / "index", "bm25")
    rs = RetrieverSettings(index=tmp_path / "index", grpc_port=0, http_port=None, metrics_port=None, token=TOKEN)
    retriever = await start_retriever(rs, await asyncio.to_thread(open_index, rs))
    reward = HttpServer(create_app(build_service(RewardSettings(port=0, token=TOKEN))))
    await reward.start()
    yield retriever.grpc_address, reward.url
    await reward.stop()
    await retriever.stop()


def _data(tmp_path):
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "question": q, "golden_answers": g, "data_source": "nq"})
                            + "\n" for i, (q, g) in enumerate(QUESTIONS[:2])))
    config = tmp_path / "run.toml"
    config.write_text('[rollout.engine]\nkind = "hf"\n[rollout.agent]\nmax_turns = 1\nmax_tokens_per_turn = 8\n'
                      "max_response_tokens = 64\n[rollout.retriever]\nretries = 1\nbackoff_s = 0.05\ntimeout_s = 2\n"
                      "[rollout.reward]\nretries = 1\nbackoff_s = 0.05\n")
    return data, config


async def _eval(*args: str, env: dict | None = None):
    from searchr1.cli import build_app

    clean = {"ROLLOUT_RETRIEVER__TOKEN": None, "ROLLOUT_REWARD__TOKEN": None, "COLUMNS": "200", **(env or {})}
    return await asyncio.to_thread(CliRunner().invoke, build_app(), ["eval", *args], env=clean)


def _one_line(result, text: str) -> None:
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], result.stderr
    assert "starting the" not in result.output  # refused before any engine starts


async def test_a_refused_retriever_token_a_silent_retriever_and_a_refused_reward_token(tmp_path, model, services):
    retriever, reward = services
    data, config = _data(tmp_path)
    common = ["--model", str(model), "--data", str(data), "--config", str(config), "--out", str(tmp_path / "o")]
    r = await _eval(*common, "--retriever", retriever, "--reward", reward)
    _one_line(r, f"retriever at {retriever} refused the token (UNAUTHENTICATED): set ROLLOUT_RETRIEVER__TOKEN")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = f"127.0.0.1:{s.getsockname()[1]}"
    r = await _eval(*common, "--retriever", free, "--reward", reward)
    _one_line(r, f"retriever at {free} does not answer")
    r = await _eval(*common, "--retriever", retriever, "--reward", reward, env={"ROLLOUT_RETRIEVER__TOKEN": TOKEN})
    _one_line(r, f"reward service at {reward} refused the token (401): set ROLLOUT_REWARD__TOKEN")
    assert not (tmp_path / "o" / "eval.json").exists()


async def test_a_run_directory_gives_addresses_and_token_and_the_report_carries_its_fingerprint(
        tmp_path, model, services):
    retriever, reward = services
    data, config = _data(tmp_path)
    write_connection(tmp_path / "run", RunConnection(run="r", redis_url="redis://:x@127.0.0.1:1/0", token=TOKEN,
                                                     retriever=retriever, reward=reward))
    r = await _eval("--model", str(model), "--data", str(data), "--config", str(config), "--samples", "0",
                    "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "o" / "eval.json").read_text())
    fp = doc["meta"]["fingerprint"]
    assert len(fp["id"]) == 64 and fp["top_k"] == 3 and fp["prompt_template"]["name"] == "search_r1"
    assert fp["retriever"]["kind"] == "bm25" and fp["retriever"]["count"] == 12
    assert fp["retriever"]["corpus"]["name"] == "corpus.jsonl" and len(fp["retriever"]["corpus"]["sha256"]) == 64
    assert len(fp["retriever"]["index_sha256"]) == 64 and fp["limits"]["max_turns"] == 1
    assert fp["model"]["path"] == str(model) and len(fp["model"]["sha256"]) == 64
    assert set(fp["metrics"]) == {"em", "cover_em", "f1", "searchr1_em", "format_valid"}
    overall = doc["summary"]["greedy"]["overall"]
    assert overall["failed_searches"] == 0 and overall["failed_scores"] == 0 and overall["scored"] == 2
    assert "Setting fingerprint" in (tmp_path / "o" / "eval.md").read_text()
    assert fp["id"][:12] in (tmp_path / "o" / "table.md").read_text()
