"""The retriever as the launcher runs it: `searchr1 index build` then `searchr1 serve retriever` as a
subprocess on chosen ports; ready line, gRPC health + GET /healthz, a search, metrics port, clean exit on
SIGTERM, from an index directory moved with its corpus after the build; a directory that is not an index
is refused with a message and exit code 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from searchr1.core.servers import free_port

SEARCHR1 = [sys.executable, "-m", "searchr1.cli"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
       "RETRIEVER_AUTH__INSECURE_NO_AUTH": "true"}  # a loopback test server


def _corpus(path: Path) -> Path:
    rows = [("Paris", "Paris is the capital of France."), ("Berlin", "Berlin is the capital of Germany."),
            ("Moon", "The Moon is Earth's only natural satellite."), ("Chess", "Chess is a board game.")]
    path.write_text("".join(json.dumps({"id": f"doc{i}", "title": t, "text": x}) + "\n"
                            for i, (t, x) in enumerate(rows)))
    return path


def test_build_serve_health_search_sigterm(tmp_path):
    (tmp_path / "data").mkdir()
    corpus = _corpus(tmp_path / "data" / "corpus.jsonl")
    built = subprocess.run([*SEARCHR1, "index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "data" / "idx"),
                            "--kind", "flat", "--no-progress"],
                           check=False, capture_output=True, text=True, env=ENV, timeout=300)
    assert built.returncode == 0, built.stderr
    assert "built flat index of 4 passages" in built.stderr
    (tmp_path / "data").rename(tmp_path / "mounted")  # e.g. served from a container mount
    out = tmp_path / "mounted" / "idx"
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    proc = subprocess.Popen([*SEARCHR1, "serve", "retriever", "--index", str(out), "--host", "127.0.0.1",
                             "--grpc-port", str(grpc_port), "--http-port", str(http_port),
                             "--metrics-port", str(metrics_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        line = proc.stdout.readline()  # blocks until ready (or exit)
        assert line.startswith("retriever ready"), (line, proc.stderr.read() if proc.poll() is not None else "")
        assert f"grpc=127.0.0.1:{grpc_port}" in line and f"http://127.0.0.1:{http_port}" in line
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
        with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=60) as http:
            assert http.get("/healthz").json()["status"] == "ok"
            r = http.post("/retrieve", json={"queries": ["capital of germany"], "topk": 1, "return_scores": True})
            hit = r.json()["result"][0][0]
            assert hit["document"] == {"id": "doc1", "contents": '"Berlin"\nBerlin is the capital of Germany.'}
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert "searchr1_retriever_batch_queries_count" in metrics
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 30
        assert "retriever stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_refuses_a_non_index(tmp_path):
    r = subprocess.run([*SEARCHR1, "serve", "retriever", "--index", str(tmp_path), "--grpc-port", "0",
                        "--http-port", "0"], check=False, capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and "no manifest.json" in r.stderr
