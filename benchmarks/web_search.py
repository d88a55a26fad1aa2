"""The web search backend on the tiny world: how often its cache answers the queries of a GRPO run, and
what the backend path costs per query against the local BM25 index, in the same run.

Queries: the tiny world's (default generator settings, seed 0) training questions, asked the way its
warm-started policy asks them — each trajectory is one `searchr1.world.traces.make_trace` draw (its
search kinds and rates are the warm start's defaults: clean queries, noisy ones with typos or truncated
names, retries, needless searches, memory answers), G trajectories per question, several epochs. Every
trajectory's searches go through the real retriever service (gRPC, `backend = "web"`, SQLite cache) in
front of a local fake of the search API answering Serper's JSON over the world's corpus (loopback: no
internet, so a miss here costs a loopback round trip, not a real API's latency).

Then a latency round, single queries one at a time, interleaved: (a) the local BM25 index over the same
corpus, (b) the web backend answering from its cache, (c) the web backend missing the cache (a fresh
query to the loopback API). (b) − (a) is the backend path's own overhead; a real API adds its latency
to (c).

Printed: queries, distinct queries, cache hit rate per epoch and overall, searches per trajectory,
p50/p99 of (a)/(b)/(c), and the modelled cost per step at Search-R1's batch sizes (train_batch_size 512,
n_agent 5) for example prices per 1,000 queries.

    .venv/bin/python benchmarks/web_search.py [--epochs 3] [--group-size 5] [--batch 32] [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.support` when run as a script

SEARCH = re.compile(r"<search> (.*?) </search>")
PRICES = (1.0, 5.0, 15.0)
"""Example prices per 1,000 queries (check your provider's price list)."""


def trajectories(world, questions, search, group_size: int, epochs: int, batch: int, seed: int):
    """Per epoch, per step: the query lists of the step's trajectories (G per question)."""
    from searchr1.world.settings import WarmstartSettings
    from searchr1.world.traces import TraceRates, make_trace

    rates, rng = TraceRates.from_settings(WarmstartSettings()), random.Random(seed)
    for epoch in range(epochs):
        order = list(questions)
        rng.shuffle(order)
        steps = []
        for s in range(0, len(order), batch):
            steps.append([SEARCH.findall(make_trace(world, q, search, rates, rng).response_text)
                          for q in order[s:s + batch] for _ in range(group_size)])
        yield epoch, steps


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def run(args) -> None:
    from searchr1.core.clients.retriever import RetrieverClient
    from searchr1.retriever.builder import build_index
    from searchr1.retriever.server import open_index, start_retriever, start_web_retriever
    from searchr1.retriever.settings import RetrieverSettings
    from searchr1.world.generator import generate_world, split_questions
    from searchr1.world.search import CorpusSearch
    from searchr1.world.settings import GeneratorSettings
    from tests.support.fake_search_api import FakeSearchAPI

    gen = GeneratorSettings()
    world = generate_world(gen, 0)
    train, _ = split_questions(world, gen.test_fraction)
    corpus = world.corpus_cache()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="web-bench-"))
    with (work / "corpus.jsonl").open("w") as f:
        for i, contents in enumerate(corpus):
            f.write(json.dumps({"id": str(i), "contents": contents}) + "\n")
    pairs = [(c.split("\n", 1)[0].strip('"'), c.split("\n", 1)[-1]) for c in corpus]
    api = await FakeSearchAPI(pairs, key="bench").start()
    web = await start_web_retriever(RetrieverSettings(backend="web", grpc_port=0, http_port=None, web={
        "provider": "serper", "base_url": api.url, "api_key": "bench", "requests_per_s": 100_000, "burst": 100_000,
        "max_concurrency": 64, "cache": {"kind": "sqlite", "path": str(work / "cache.sqlite")}}))
    await asyncio.to_thread(build_index, work / "corpus.jsonl", work / "index", "bm25")
    local_settings = RetrieverSettings(index=work / "index", grpc_port=0, http_port=None)
    local = await start_retriever(local_settings, await asyncio.to_thread(open_index, local_settings))
    reg = web.service.metrics.registry

    def sample(name: str) -> float:
        return reg.get_sample_value(name, {"backend": "serper"}) or 0.0

    try:
        async with RetrieverClient([web.grpc_address]) as wc, RetrieverClient([local.grpc_address]) as lc:
            per_epoch, searches, distinct = [], [], set()
            bm25 = CorpusSearch(corpus).search
            for epoch, steps in trajectories(world, train, bm25, args.group_size, args.epochs, args.batch, 0):
                q0, h0 = sample("searchr1_retriever_backend_queries_total"), sample(
                    "searchr1_retriever_backend_cache_hits_total")
                for step in steps:
                    async def one(queries: list[str]) -> None:
                        for q in queries:  # a trajectory searches turn after turn
                            await wc.search([q], 3)

                    await asyncio.gather(*(one(t) for t in step))
                    searches += [len(t) for t in step]
                    distinct |= {" ".join(q.casefold().split()) for t in step for q in t}
                q1, h1 = sample("searchr1_retriever_backend_queries_total"), sample(
                    "searchr1_retriever_backend_cache_hits_total")
                per_epoch.append((epoch + 1, int(q1 - q0), (h1 - h0) / max(1.0, q1 - q0)))
            total_q = sample("searchr1_retriever_backend_queries_total")
            total_hits = sample("searchr1_retriever_backend_cache_hits_total")
            requests = api.calls["serper"]

            lat = {"local": [], "web_hit": [], "web_miss": []}
            known = sorted(distinct)
            rng = random.Random(1)
            for i in range(args.rounds):
                q = rng.choice(known)
                for kind, client, query in (("local", lc, q), ("web_hit", wc, q), ("web_miss", wc, f"{q} r{i}")):
                    t0 = time.perf_counter()
                    await client.search([query], 3)
                    lat[kind].append((time.perf_counter() - t0) * 1000)
    finally:
        await web.stop()
        await local.stop()
        await api.stop()

    per_traj = statistics.fmean(searches)
    print(f"tiny world: {len(train)} training questions, G={args.group_size}, {args.epochs} epochs, "
          f"{args.batch} questions per step")
    print(f"queries {int(total_q)}, distinct {len(distinct)}, searches per trajectory {per_traj:.2f}, "
          f"API requests {requests}")
    for epoch, n, rate in per_epoch:
        print(f"  epoch {epoch}: {n} queries, cache hit rate {rate:.1%}")
    overall = total_hits / max(1.0, total_q)
    print(f"  overall cache hit rate {overall:.1%}")
    print("latency per single-query search, ms (p50 / p99), interleaved rounds:")
    for kind in ("local", "web_hit", "web_miss"):
        print(f"  {kind:9s} {percentile(lat[kind], 50):6.2f} / {percentile(lat[kind], 99):6.2f}")
    overhead = percentile(lat["web_hit"], 50) - percentile(lat["local"], 50)
    print(f"  backend path overhead (web_hit - local, p50): {overhead:+.2f} ms")
    step_queries = 512 * 5 * per_traj
    first = per_epoch[0][2]
    later = statistics.fmean(r for _, _, r in per_epoch[1:]) if len(per_epoch) > 1 else first
    print(f"Search-R1 step (512 questions x 5): {step_queries:.0f} queries; billed at the hit rates above:")
    for label, rate in (("epoch 1", first), ("later epochs", later), ("no cache", 0.0)):
        billed = step_queries * (1 - rate)
        costs = ", ".join(f"{billed * p / 1000:.2f} at {p:g}/1k" for p in PRICES)
        print(f"  {label:12s} hit {rate:5.1%}: {billed:7.0f} billed -> {costs}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--group-size", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--workdir", default=None)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
