"""The retriever as the launcher runs it (`searchr1 serve retriever`, a subprocess) holds 256 concurrent
closed-loop clients (128 over HTTP `/retrieve`, 128 over gRPC `Search`) for 60 s: no request fails,
and its resident memory after the load and at its peak stays within a bound of what it was after a
warm-up. Prints the request counts, latencies and RSS before / peak / after (docs/reliability.md,
"Load")."""

from __future__ import annotations

import pytest

from tests.load.retriever_load import closed_loop, serve_retriever, write_bm25_index

pytestmark = pytest.mark.load

RSS_GROWTH_BOUND_MIB = 256.0


async def test_256_clients_for_60s_without_errors_and_bounded_memory(tmp_path):
    index = write_bm25_index(tmp_path)
    with serve_retriever(index) as served:
        result = await closed_loop(served, clients=256, seconds=60.0, warmup_s=5.0)
    print(result.summary())
    assert result.errors == [], result.errors[:5]
    assert result.requests["http"] > 0 and result.requests["grpc"] > 0
    assert result.rss_peak_mib - result.rss_before_mib < RSS_GROWTH_BOUND_MIB, result.summary()
    assert result.rss_after_mib - result.rss_before_mib < RSS_GROWTH_BOUND_MIB, result.summary()
