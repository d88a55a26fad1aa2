"""Thread counts sized to the batch: torch and FAISS run one thread for small batches and all cores for
large ones.

Owns: the policy (a pure function of the batch size, tested) and applying it on the thread that
searches. torch's intra-op count and FAISS's OpenMP count are set only when they change, so a run of
same-sized batches costs nothing. It does not decide batch sizes (the micro-batcher does).

Why: a one-query encode + search is too small to split (a second thread only adds synchronisation and
spin-waiting that takes the core the event loop needs for HTTP), while a batch of dozens of queries is
one big matrix product that scales with cores. With one fixed count the server loses either way: one
thread leaves half of a 2-core machine idle on batches, two threads slow every small request
(docs/retriever.md, "Performance"; docs/architecture.md, "Platform notes").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def passive_openmp_waits() -> None:
    """Make idle OpenMP threads sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE unless already set).

    torch and FAISS each bundle their own libgomp; with their default (spin before sleeping) a second
    thread that finishes its share spins on a core that the event loop, the other pool or another
    process needs. Measured on a shared 2-core machine, batch 32 with two threads: 21.5 ms of CPU per
    query spinning, 3.7 ms passive (one thread: 3.5 ms). Read once when each libgomp loads, so this only
    takes effect before torch and faiss are imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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
    _current: int = field(default=0, repr=False)

    @classmethod
    def from_settings(cls, settings) -> ThreadPolicy:
        """From `RetrieverSettings` (`torch_threads`, `batch_threads`, `batch_threads_from`)."""
        large = settings.batch_threads or available_cores()
        return cls(small=settings.torch_threads, small_faiss=settings.faiss_threads, large=large,
                   large_from=settings.batch_threads_from)

    def apply(self, batch: int) -> int:
        """Set torch and FAISS to the batch's thread count (only if it changed); returns the count."""
        n = threads_for(batch, small=self.small, large=self.large, large_from=self.large_from)
        if n != self._current:
            import faiss
            import torch

            torch.set_num_threads(n)
            faiss.omp_set_num_threads(n if batch >= self.large_from else self.small_faiss)
            self._current = n
        return n
