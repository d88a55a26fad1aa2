"""`searchr1 serve retriever` with the web backend chosen by configs/retriever-web.toml (overridden by
RETRIEVER_* environment variables, the key in the variable the config names) as a subprocess, in front of
a local fake search API: ready line, POST /retrieve, metrics, clean exit on SIGTERM, and the key in no
output; a paid provider without a key is refused with a message and exit code 2."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx

from searchr1.core.servers import free_port
from tests.support.fake_search_api import FakeSearchAPI
from tests.support.rollout_stack import CORPUS

SEARCHR1 = [sys.executable, "-m", "searchr1.cli"]
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "retriever-web.toml"
KEY = "sk-cli-secret-4242"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRIEVER_") and k != "SERPER_API_KEY"}
    return {**env, "OMP_NUM_THREADS": "1", "RETRIEVER_AUTH__INSECURE_NO_AUTH": "true", **extra}


async def test_serve_web_backend_from_the_config(tmp_path):
    api = await FakeSearchAPI(CORPUS, key=KEY).start()
    grpc_port, http_port = free_port(), free_port()
    env = _env(SERPER_API_KEY=KEY, RETRIEVER_WEB__BASE_URL=api.url, RETRIEVER_WEB__CACHE__KIND="sqlite",
               RETRIEVER_WEB__CACHE__PATH=str(tmp_path / "cache.sqlite"), RETRIEVER_LOG_LEVEL="debug")
    proc = await asyncio.create_subprocess_exec(
        *SEARCHR1, "serve", "retriever", "--config", str(CONFIG), "--grpc-port", str(grpc_port),
        "--http-port", str(http_port), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        assert line.startswith("retriever ready") and "backend=web provider=serper cache=sqlite" in line, line
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as http:
            r = await http.post("/retrieve", json={"queries": ["capital of germany"], "topk": 1})
            assert r.json() == {"result": [[{"id": "https://example.org/wiki/Berlin",
                                             "contents": '"Berlin"\nBerlin is the capital and largest city of Germany.'}]]}
            assert (await http.get("/healthz")).json() == {"status": "ok", "backend": "web", "provider": "serper"}
            metrics = (await http.get("/metrics")).text
        assert 'searchr1_retriever_backend_requests_total{backend="serper",outcome="ok"} 1.0' in metrics
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        out, err = (await proc.stdout.read()).decode(), (await proc.stderr.read()).decode()
        assert "retriever stopped" in err and "HTTP Request" in err
        assert KEY not in out + err + line
        assert api.calls["serper"] == 1
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await api.stop()


async def test_a_paid_provider_without_its_key_is_refused(tmp_path):
    proc = await asyncio.create_subprocess_exec(
        *SEARCHR1, "serve", "retriever", "--config", str(CONFIG), "--grpc-port", "0", "--http-port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_env(RETRIEVER_WEB__CACHE__KIND="off"))
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 2 and "needs an API key" in err.decode()
