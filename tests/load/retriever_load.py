"""Closed-loop load on a retriever — served as the launcher runs it (`searchr1 serve retriever`, a
subprocess, so its memory is its own) or in the test's process (`serve_in_process`): N clients, half over HTTP `/retrieve` and half over gRPC
`Search`, each sending one request, waiting for the answer and sending the next, for a fixed time;
every failure (transport error, non-200, gRPC status, a malformed answer) is recorded, and the server's
resident memory (the subprocess's, or the whole test process's in process) is read from /proc before
the load (after a warm-up at full concurrency), every half-second during it (the peak) and after it."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx

from searchr1.core.api import retriever_pb2, retriever_pb2_grpc
from searchr1.core.servers import free_port

WORDS = ("river", "mountain", "capital", "empire", "novel", "planet", "composer", "island", "bridge", "war",
         "language", "painter", "festival", "railway", "desert", "treaty", "museum", "volcano", "opera", "king")


def write_bm25_index(workdir: Path, passages: int = 2000, seed: int = 0) -> Path:
    """A BM25 index over `passages` synthetic passages; returns its directory."""
    from searchr1.retriever.builder import build_index

    rng = random.Random(seed)
    corpus = workdir / "corpus.jsonl"
    with corpus.open("w") as f:
        for i in range(passages):
            text = " ".join(rng.choice(WORDS) for _ in range(40))
            f.write(json.dumps({"id": str(i), "contents": f'"Passage {i}"\n{text}'}) + "\n")
    build_index(corpus, workdir / "index", "bm25")
    return workdir / "index"


@dataclass
class Served:
    pid: int
    grpc_address: str
    http_url: str


@contextmanager
def serve_retriever(index: Path) -> Iterator[Served]:
    """`searchr1 serve retriever` on free loopback ports, until the block exits (SIGTERM)."""
    grpc_port, http_port = free_port(), free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "RETRIEVER_AUTH__INSECURE_NO_AUTH": "true"}
    proc = subprocess.Popen([sys.executable, "-m", "searchr1.cli", "serve", "retriever", "--index", str(index),
                             "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", str(http_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = proc.stdout.readline()  # the ready line (or EOF if it died)
        if not line.startswith("retriever ready"):
            raise RuntimeError(f"retriever did not start (exit {proc.poll()}): {line!r}")
        yield Served(proc.pid, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@asynccontextmanager
async def serve_in_process(index: Path) -> AsyncIterator[Served]:
    """The retriever's servers on this event loop (searches run in its threads), until the block exits."""
    from searchr1.retriever.server import open_index, start_retriever
    from searchr1.retriever.settings import RetrieverSettings

    settings = RetrieverSettings(index=index, grpc_port=0, http_port=0, metrics_port=None)
    running = await start_retriever(settings, await asyncio.to_thread(open_index, settings))
    try:
        yield Served(os.getpid(), running.grpc_address, running.http.url)
    finally:
        await running.stop()


def rss_mib(pid: int) -> float:
    """Resident memory of `pid` (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class LoadResult:
    clients: int
    seconds: float
    requests: dict[str, int] = field(default_factory=lambda: {"http": 0, "grpc": 0})
    errors: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    rss_before_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_after_mib: float = 0.0

    def percentile(self, q: float) -> float:
        xs = sorted(self.latencies_s)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    def summary(self) -> str:
        total = sum(self.requests.values())
        return (f"{self.clients} clients for {self.seconds:.0f} s: {total} requests (http {self.requests['http']}, "
                f"grpc {self.requests['grpc']}; {total / self.seconds:.0f}/s), {len(self.errors)} errors, "
                f"latency p50 {self.percentile(0.5) * 1000:.0f} ms p99 {self.percentile(0.99) * 1000:.0f} ms; "
                f"server RSS before {self.rss_before_mib:.0f} MiB, peak {self.rss_peak_mib:.0f} MiB, "
                f"after {self.rss_after_mib:.0f} MiB")


async def closed_loop(served: Served, clients: int, seconds: float, *, warmup_s: float = 2.0,
                      timeout_s: float = 60.0, seed: int = 0) -> LoadResult:
    """`clients` closed-loop clients (half HTTP, half gRPC) for `warmup_s` unmeasured, then `seconds`."""
    result = LoadResult(clients, seconds)
    rng = random.Random(seed)
    pid = served.pid
    measuring = False
    stop_at = float("inf")

    def record(kind: str, t0: float, error: str | None) -> None:
        if not measuring:
            return
        if error is not None:
            result.errors.append(f"{kind}: {error}")
        else:
            result.requests[kind] += 1
            result.latencies_s.append(time.perf_counter() - t0)

    async def http_client(http: httpx.AsyncClient) -> None:
        while time.monotonic() < stop_at:
            q = " ".join(rng.choice(WORDS) for _ in range(3))
            t0 = time.perf_counter()
            try:
                r = await http.post("/retrieve", json={"queries": [q], "topk": 3})
                ok = r.status_code == 200 and len(r.json()["result"][0]) == 3
                record("http", t0, None if ok else f"HTTP {r.status_code} {r.text[:200]}")
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                record("http", t0, f"{type(exc).__name__}: {exc}")

    async def grpc_client(stub: retriever_pb2_grpc.RetrieverStub) -> None:
        while time.monotonic() < stop_at:
            q = " ".join(rng.choice(WORDS) for _ in range(3))
            t0 = time.perf_counter()
            try:
                resp = await stub.Search(retriever_pb2.SearchRequest(queries=[q], top_k=3), timeout=timeout_s)
                record("grpc", t0, None if len(resp.results[0].hits) == 3 else "short answer")
            except grpc.aio.AioRpcError as exc:
                record("grpc", t0, f"{exc.code().name}: {exc.details()}")

    async def sample_rss() -> None:
        while time.monotonic() < stop_at:
            result.rss_peak_mib = max(result.rss_peak_mib, rss_mib(pid))
            await asyncio.sleep(0.5)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=served.http_url, timeout=timeout_s, limits=limits,
                                 trust_env=False) as http, grpc.aio.insecure_channel(served.grpc_address) as channel:
        stub = retriever_pb2_grpc.RetrieverStub(channel)
        n_http = clients // 2
        stop_at = time.monotonic() + warmup_s + seconds
        tasks = [asyncio.create_task(http_client(http)) for _ in range(n_http)]
        tasks += [asyncio.create_task(grpc_client(stub)) for _ in range(clients - n_http)]
        await asyncio.sleep(warmup_s)
        result.rss_before_mib = rss_mib(pid)
        measuring = True
        t_start = time.monotonic()
        sampler = asyncio.create_task(sample_rss())
        await asyncio.gather(*tasks, sampler)
        result.seconds = time.monotonic() - t_start
    result.rss_after_mib = rss_mib(pid)
    result.rss_peak_mib = max(result.rss_peak_mib, result.rss_after_mib)
    return result
