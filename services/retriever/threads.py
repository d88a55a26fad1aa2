"""Search-time settings sized to the batch: torch and FAISS run one thread for small batches and all
cores for large ones, and FAISS's Flat search takes its BLAS path only for batches of several queries.

Owns: the policy (pure functions of the batch size, tested) and applying it on the thread that
searches. torch's intra-op count, FAISS's OpenMP count and its BLAS threshold are set only when they
change, so a run of same-sized batches costs nothing. It does not decide batch sizes (the micro-batcher
does).

BLAS: FAISS (1.15) takes the BLAS path of a brute-force search when the query count *or the database size*
reaches `distance_compute_blas_threshold`, so a low threshold sends one query through a matrix product too.
On a 20,000 × 384 Flat index (one thread; 2 cores, 24 GiB, shared): one query costs 2.3 ms of CPU on FAISS's
own loop and 6.6 ms through BLAS; 8 queries cost 2.2 vs 0.8 ms each, 64 queries 2.0 vs 0.24 ms each. Hence a
low threshold from `blas_from` queries on and FAISS's default (128,000, in effect never) below.

Why: a one-query encode + search is too small to split (a second thread only adds synchronisation and
spin-waiting that takes the core the event loop needs for HTTP), while a batch of dozens of queries is
one big matrix product that scales with cores. With one fixed count the server loses either way: one
thread leaves half of a 2-core machine idle on batches, two threads slow every small request
(docs/performance.md, "Retriever"; docs/architecture.md, "Platform notes").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


FAISS_DEFAULT_BLAS_THRESHOLD = 128_000
"""faiss.cvar.distance_compute_blas_threshold as FAISS ships it."""


def blas_threshold_for(batch: int, *, low: int, blas_from: int) -> int:
    """FAISS's BLAS threshold for a batch: `low` (BLAS) from `blas_from` queries, FAISS's default below."""
    return low if batch >= blas_from else FAISS_DEFAULT_BLAS_THRESHOLD


def threads_for(batch: int, *, small: int, large: int, large_from: int) -> int:
    """Threads for a batch of `batch` queries: `small` below `large_from` queries, `large` from there."""
    return large if batch >= large_from else small


@dataclass
class ThreadPolicy:
    """Applies `threads_for` to torch and FAISS on the calling thread (OpenMP counts are per thread: call
    it on the thread that searches)."""

    small: int = 1
    """torch threads for batches below `large_from` queries."""
    small_faiss: int = 1
    """FAISS threads for batches below `large_from` queries."""
    large: int = 1
    """Threads for batches of `large_from` queries or more."""
    large_from: int = 16
    """Batch size (queries) from which `large` threads are used."""
    blas_threshold: int = 20
    """FAISS BLAS threshold for batches of `blas_from` queries or more."""
    blas_from: int = 4
    """Batch size (queries) from which FAISS's Flat search may take the BLAS path."""
    _current: int = field(default=0, repr=False)
    _blas: int = field(default=-1, repr=False)

    @classmethod
    def from_settings(cls, settings) -> ThreadPolicy:
        """From `RetrieverSettings` (`torch_threads`, `batch_threads`, `batch_threads_from`)."""
        large = settings.batch_threads or available_cores()
        return cls(small=settings.torch_threads, small_faiss=settings.faiss_threads, large=large,
                   large_from=settings.batch_threads_from, blas_threshold=settings.faiss_blas_threshold,
                   blas_from=settings.faiss_blas_from)

    def apply(self, batch: int) -> int:
        """Set torch and FAISS to the batch's thread count and BLAS threshold (only what changed); returns
        the thread count."""
        n = threads_for(batch, small=self.small, large=self.large, large_from=self.large_from)
        blas = blas_threshold_for(batch, low=self.blas_threshold, blas_from=self.blas_from)
        if n != self._current or blas != self._blas:
            import faiss
            import torch

            if n != self._current:
                torch.set_num_threads(n)
                faiss.omp_set_num_threads(n if batch >= self.large_from else self.small_faiss)
                self._current = n
            faiss.cvar.distance_compute_blas_threshold = blas
            self._blas = blas
        return n
