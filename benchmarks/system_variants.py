"""The variants of the system benchmark (`benchmarks/system.py`): how each one runs the same training, as
config overrides of the base run config. Pure: no process is started here.

The comparison users would make puts each regime where it belongs:

- `lockstep` (colocated): `max_staleness = 0`, every process on every core (`cpu_colocate`), so each
  phase takes all the cores in turn — as Search-R1's hybrid engine gives each phase every GPU;
- `async1`, `async2` (disaggregated): `max_staleness` 1 and 2, the rollout worker (with the retriever,
  the reward service and Redis beside it) on its own cores and the learner on the rest, so generation
  for step t+1 overlaps training of step t on separate devices.

The variants of earlier measurements stay runnable under their names (`lockstep-os`, `async2-shared`,
…): no placement, every process wherever the OS puts it (vLLM's CPU engine then binds itself to the first
core of a NUMA node and reserves another).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Variant:
    """One way of running the same training: staleness, workers, placement and any other overrides."""

    name: str
    label: str
    max_staleness: int
    workers: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)
    """Dotted config keys (`learner.checkpoint.every`) and their values."""
    drop: tuple[str, ...] = ()
    """Dotted config keys removed from the base config (values a placement decides)."""


PLACEMENT_DECIDES = ("learner.threads", "retriever.batch_threads")
"""Base-config values a core placement sets itself (refused when they say otherwise): dropped."""


def colocated(cores: int) -> dict[str, Any]:
    """Every process on every core."""
    every = list(range(cores))
    return {"placement": {"cpus": cores, "cpu_colocate": True, **{role: {"cores": every} for role in
                                                                  ("rollout", "learner", "retriever", "reward",
                                                                   "redis")}}}


def disaggregated(cores: int, rollout_cores: int, workers: int = 1) -> dict[str, Any]:
    """The first `rollout_cores` cores to the rollout workers (the small services beside them), the rest to
    the learner."""
    if not 1 <= rollout_cores < cores:
        raise ValueError(f"--rollout-cores must leave the learner a core: 1 ≤ {rollout_cores} < {cores}")
    if rollout_cores % workers:
        raise ValueError(f"{rollout_cores} rollout cores cannot be cut into {workers} workers")
    return {"placement": {"cpus": cores, "rollout": {"cores": list(range(rollout_cores)), "workers": workers},
                          "learner": {"cores": list(range(rollout_cores, cores))},
                          **{role: {"cores_with": "rollout"} for role in ("retriever", "reward", "redis")}}}


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and key != "env":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def variants(cores: int, rollout_cores: int) -> dict[str, Variant]:
    """Every known variant for a machine of `cores` cores, the disaggregated ones with `rollout_cores` of
    them for rollout."""
    coloc = _flat(colocated(cores))
    split = _flat(disaggregated(cores, rollout_cores))
    side = f"rollout on {rollout_cores} core(s), learner on {cores - rollout_cores}"
    out = [
        Variant("lockstep", f"lockstep, colocated (every core, in turn; {cores})", 0, overrides=coloc,
                drop=PLACEMENT_DECIDES),
        Variant("async1", f"async k = 1, disaggregated ({side})", 1, overrides=split, drop=PLACEMENT_DECIDES),
        Variant("async2", f"async k = 2, disaggregated ({side})", 2, overrides=split, drop=PLACEMENT_DECIDES),
        # earlier measurements: no placement (the OS and vLLM's own binding decide)
        Variant("lockstep-os", "(a) lockstep, max_staleness 0, no placement", 0),
        Variant("async1-shared", "(b) async, max_staleness 1, no placement", 1),
        Variant("async2-shared", "(b) async, max_staleness 2, no placement", 2),
        Variant("async2x2-shared", "(c) async, max_staleness 2, 2 workers, no placement", 2, workers=2),
        Variant("async2-t1", "async, max_staleness 2, learner on 1 thread, no placement", 2,
                overrides={"learner.threads": 1}),
        Variant("async2-spin", "async, max_staleness 2, learner threads spin, no placement", 2,
                overrides={"learner.openmp_waits": "spin"}),
        Variant("async2x2-bind", "async, max_staleness 2, 2 workers, one core each, no placement", 2, workers=2,
                overrides={"launcher.rollout.env.VLLM_CPU_OMP_THREADS_BIND": "{worker_index}"}),
        Variant("async2-mb32", "async, max_staleness 2, micro-batches of 32, no placement", 2,
                overrides={"learner.batch.micro_batch_size": 32}),
    ]
    return {v.name: v for v in out}
