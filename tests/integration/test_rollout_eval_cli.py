"""`searchr1 eval` as a real process on a tasks JSONL (our format) with a run config: it starts its own vLLM
engine, talks to a real BM25 retriever and the real reward service, prints the summary table and writes
eval.json / eval.md; a missing test set is refused with exit code 2 before any engine starts. The
end-to-end run is slow (a second vLLM engine start in a subprocess): run with `-m slow`."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from tests.support.rollout_stack import QUESTIONS, start_retriever, start_reward
from tests.support.tiny_lm import build_tiny_lm


async def _searchr1(*args: str, env: dict | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "searchr1.cli", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=600)
    return proc.returncode, out.decode()


async def test_eval_refuses_a_missing_test_set(tmp_path):
    rc, out = await _searchr1("eval", "--model", str(tmp_path), "--data", str(tmp_path / "nope.parquet"))
    assert rc == 2 and "test set not found" in out


@pytest.mark.slow
async def test_eval_command_end_to_end(tmp_path):
    model = build_tiny_lm(tmp_path / "model")
    retriever = await start_retriever(tmp_path)
    reward = await start_reward()
    data = tmp_path / "tasks-test.jsonl"
    data.write_text("".join(
        json.dumps({"task_id": f"t{i}", "question": q, "golden_answers": g, "data_source": f"ds{i % 2}",
                    "metadata": {"knowledge": "known" if i % 2 else "unknown"}}) + "\n"
        for i, (q, g) in enumerate(QUESTIONS)))
    config = tmp_path / "run.toml"
    config.write_text('[rollout.engine]\ngpu_memory_utilization = 0.05\ndtype = "float32"\n'
                      "[rollout.agent]\nmax_tokens_per_turn = 32\nmax_response_tokens = 400\n"
                      '[rollout.eval]\ngroup_by = ["data_source", "knowledge"]\n')
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    try:
        rc, out = await _searchr1("eval", "--model", str(model), "--data", str(data), "--retriever",
                                  retriever.address, "--reward", reward.url, "--out", str(tmp_path / "out"),
                                  "--limit", "4", "--samples", "2", "--max-turns", "2", "--config", str(config),
                                  env=env)
    finally:
        await reward.stop()
        await retriever.stop()
    assert rc == 0, out
    assert "knowledge" in out and "eval.json" in out
    doc = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert doc["meta"]["questions"] == 4 and doc["meta"]["max_turns"] == 2
    assert doc["meta"]["max_tokens_per_turn"] == 32  # from the config
    assert len(doc["records"]) == 4 * 3
    assert list(doc["summary"]["sampled"]["by"]) == ["data_source", "knowledge"]  # the config's group keys
    assert (tmp_path / "out" / "eval.md").read_text().startswith("# Evaluation")
    # the engine is freed by close(); left to interpreter exit, vLLM's AsyncLLM.__del__ prints a traceback
    assert "Exception ignored" not in out and "Traceback" not in out, out[-3000:]
