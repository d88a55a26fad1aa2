"""How idle OpenMP threads wait, set before torch or FAISS load (each bundles its own libgomp, which reads
`OMP_WAIT_POLICY` once, when it loads).

libgomp's default is to spin for a while before sleeping. That is fastest for a process alone on its
cores, and costly for one that shares them: a thread whose core is taken by another process falls behind,
and the others spin at every barrier waiting for it. `PASSIVE` makes idle threads sleep at once. Measured
on 2 cores, 24 GiB (tiny-world learner step, 64 trajectories, ~19.8k tokens, two torch threads):

| | libgomp default | PASSIVE | one thread |
|---|---|---|---|
| alone | 1.64–1.86 s | 1.92–2.02 s | 2.35–2.41 s |
| one core busy with another process (a vLLM CPU engine) | 4.59–5.02 s | 2.46–3.14 s | 2.36–2.41 s |

The retriever's search thread, batch 32 with two threads on the same machine while it was shared: 21.5 ms
of CPU per query spinning, 3.7 ms passive (one thread: 3.5 ms).

A value already in the environment always wins: these functions only fill it in.
"""

from __future__ import annotations

import os
from typing import Literal

WaitPolicy = Literal["passive", "spin"]


def set_openmp_waits(policy: WaitPolicy) -> str:
    """Apply `policy` to OpenMP libraries loaded after this call, unless `OMP_WAIT_POLICY` is already set;
    returns the policy in effect (`PASSIVE`, `ACTIVE`, or `default` for libgomp's spin-then-sleep)."""
    if policy == "passive":
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return os.environ.get("OMP_WAIT_POLICY", "default")


def passive_openmp_waits() -> None:
    """Make idle OpenMP threads sleep instead of spinning (`OMP_WAIT_POLICY=PASSIVE` unless already set)."""
    set_openmp_waits("passive")
