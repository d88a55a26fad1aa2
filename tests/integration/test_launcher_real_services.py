"""`searchr1 up` with the real retriever and reward services: the launcher builds a BM25 index with the real
`searchr1 index build`, gates the real `serve retriever` (gRPC health + HTTP /healthz) and `serve reward`
(/healthz) through the default command templates, and Search-R1's own retrieval payload works against the
launched retriever with the run's generated token (and not without it). The learner is the stand-in from test_launcher_up (rollout workers: 0, since a vLLM
worker needs a model); Ctrl-C stops everything and leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import httpx
from test_launcher_up import FAKE_SERVICE, finish, pid_alive, wait_for


def _processes(run_dir) -> dict:
    try:
        return json.loads((run_dir / "processes.json").read_text())
    except (OSError, ValueError):
        return {}


def test_real_retriever_and_reward_under_the_launcher(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [("Paris", "Paris is the capital of France."), ("Berlin", "Berlin is the capital of Germany."),
            ("Rome", "Rome is the capital of Italy."), ("Madrid", "Madrid is the capital of Spain.")]
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n"
                              for i, (t, x) in enumerate(rows)))
    fake = tmp_path / "fake_service.py"
    fake.write_text(FAKE_SERVICE)
    cfg = tmp_path / "run.toml"
    cfg.write_text(textwrap.dedent(f"""
        [launcher]
        run = "real"
        grace_period_s = 10.0
        commands.learner = {json.dumps([sys.executable, str(fake)])}

        [launcher.retriever]
        index_dir = "{tmp_path / 'index'}"
        corpus = "{corpus}"
        health_timeout_s = 120

        [launcher.reward]
        health_timeout_s = 120

        [launcher.rollout]
        workers = 0

        [launcher.status]
        refresh_s = 0.5
        plain_interval_s = 1.0

        [retriever]
        log_level = "info"
        shutdown_grace_s = 0.5

        [reward]
        workers = 1
        """))
    records = tmp_path / "records"
    records.mkdir()
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchr1.launcher", "--config", str(cfg), "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "FAKE_RECORD_DIR": str(records), "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_for(lambda: (records / "learner.json").exists()
                 and "healthy_at" in json.loads((records / "learner.json").read_text()), timeout=180,
                 what="the learner stand-in to be up (after the real retriever and reward)")
        # the launcher records the learner in processes.json once it has started it; the stand-in's own
        # record can come first
        wait_for(lambda: "learner" in _processes(run_dir), timeout=60, what="processes.json to list the learner")
        table = json.loads((run_dir / "processes.json").read_text())
        assert list(table) == ["redis", "index-build", "retriever", "reward", "learner"]
        assert table["retriever"]["argv"][3:5] == ["serve", "retriever"]
        http_port = table["retriever"]["argv"][table["retriever"]["argv"].index("--http-port") + 1]
        payload = {"queries": ["capital of Italy"], "topk": 3, "return_scores": True}
        # the launched retriever requires the run's generated token (the processes get it by environment)
        assert httpx.post(f"http://127.0.0.1:{http_port}/retrieve", json=payload, timeout=30).status_code == 401
        token = json.loads((records / "learner.json").read_text())["env"]["LEARNER_WEIGHTS__TOKEN"]
        resp = httpx.post(f"http://127.0.0.1:{http_port}/retrieve", json=payload, timeout=30,
                          headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 200, resp.text
        top = resp.json()["result"][0][0]
        assert top["document"]["contents"].startswith('"Rome"') and "score" in top
        reward_port = table["reward"]["argv"][table["reward"]["argv"].index("--port") + 1]
        assert httpx.get(f"http://127.0.0.1:{reward_port}/healthz", timeout=10).status_code == 200
        pids = [r["pid"] for r in table.values()]
        proc.send_signal(signal.SIGINT)
        code, out = finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 130, out
    assert "index-build done" in out and "retriever healthy" in out and "reward healthy" in out, out
    assert (run_dir / "logs" / "retriever.log").read_text().count("retriever ready") >= 1
    wait_for(lambda: not [p for p in pids if pid_alive(p)], timeout=10, what="every process to be gone")
