"""A shipped run config made runnable on CPU for a rehearsal (`searchr1 rehearse`), with only what cannot
exist on the machine swapped for stand-ins — and nothing else. Pure: dicts in, dicts out.

The swap is explicit: `SWAPS` names every key the rehearsal may change, with the reason; `ADDED_TABLES`
the tables it may supply to a config that has none (a learner-only config gets the other services from
`configs/searchr1-3b-grpo.toml`'s tables). `check_swaps` compares the shipped config with the rehearsed one
key by key and refuses any other difference, so the rehearsal cannot drift into the demo's settings: the
config's dtype, learning rate and schedule, KL and clip settings, micro-batching, mini-batches, checkpoint
cadence, weight transport, staleness bound and group size all run as written. tests/unit/
test_launcher_rehearsal.py holds the list as it stands: growing it means changing that test too.

What is swapped, and why:
- the model — a tiny model of the same family (the tiny world's Qwen2 warm start: Qwen2.5 is Qwen2's
  architecture) for the policy, the critic and the engine; the engine's context to the stand-in's;
- the data and index — the tiny world's training questions and its BM25 index over its corpus;
- the devices — no GPUs: no `[placement]`, one CPU rollout worker, the learner as two ranks on gloo under
  torchrun, the engine eager with a KV cache sized in GiB of host memory (vLLM's CPU backend reads
  `gpu_memory_utilization` as a share of host memory), one thread per retriever library and one reward
  worker on a machine of few cores;
- the batch — `groups_per_step` (and the dispatcher's `max_inflight` with it) to `REHEARSAL_GROUPS`:
  a 512-group step is 2,560 trajectories, hours on a few CPU cores. Mini-batches, micro-batch size and
  group size stay, so each step still cuts mini-batches, splits them into micro-batches and shards them
  over two ranks;
- the run — its name and directory, and `--max-steps` on the learner's command line (the schedule's
  `total_steps` stays, so the learning rate of each step is the configured one).
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REHEARSAL_GROUPS = 8
"""Groups per step in a rehearsal (the configs' 512 scaled down; see the module docstring)."""

SWAPS: dict[str, str] = {
    "rollout.model": "model: the stand-in (a tiny Qwen2)",
    "learner.model.path": "model: the stand-in (a tiny Qwen2)",
    "learner.model.critic_path": "model: the stand-in (a tiny Qwen2)",
    "rollout.engine.max_model_len": "model: the stand-in's context (2,048 positions)",
    "learner.dispatcher.dataset": "data: the tiny world's training questions",
    "launcher.retriever.index_dir": "index: the tiny world's BM25 index",
    "launcher.retriever.kind": "index: BM25 over the tiny world's corpus",
    "launcher.retriever.corpus": "index: the tiny world's corpus",
    "launcher.retriever.health_timeout_s": "index: a tiny index loads in seconds",
    "retriever.search": "index: the dense encoder's settings do not apply to a BM25 index",
    "placement": "devices: no GPUs to place",
    "launcher.commands.learner": "devices: the learner's ranks as two gloo processes under torchrun",
    "launcher.rollout.workers": "devices: one CPU rollout worker",
    "launcher.rollout.env": "devices: vLLM's CPU KV cache in GiB of host memory",
    "rollout.engine.gpu_memory_utilization": "devices: on CPU a share of host memory",
    "rollout.engine.enforce_eager": "devices: CUDA graphs are a GPU feature",
    "rollout.engine.tensor_parallel_size": "devices: one CPU engine",
    "learner.device": "devices: CPU",
    "learner.threads": "devices: one thread a rank",
    "retriever.torch_threads": "devices: few cores",
    "retriever.faiss_threads": "devices: few cores",
    "reward.workers": "devices: few cores",
    "learner.batch.groups_per_step": f"compute: {REHEARSAL_GROUPS} groups a step",
    "learner.dispatcher.max_inflight": "compute: the step's groups in flight, as configured relative to it",
    "launcher.run": "run: a rehearsal's own name",
    "launcher.run_dir": "run: a rehearsal's own directory",
    "launcher.learner.extra_args": "run: --max-steps (the schedule's total_steps stays)",
}
"""Every key (or table) a rehearsal may change, with the reason."""

ADDED_TABLES = ("launcher", "rollout", "retriever", "reward")
"""Tables a rehearsal may add to a config that has none of that table (a learner-only config)."""

NAMING_KEYS = ("launcher.run", "launcher.run_dir", "learner.redis.run", "learner.log_dir",
               "learner.weights.dir", "learner.checkpoint.dir")
"""Keys that name a run or where it writes: left out when telling whether two rehearsals are the same."""


class RehearsalError(ValueError):
    """A rehearsal that cannot be made or would change more than `SWAPS` allows."""


@dataclass(frozen=True)
class StandIns:
    """What a rehearsal runs on instead of the config's model, data, index and devices."""

    model: Path
    """A tiny model of the config's family, with its tokenizer (the tiny world's warm start)."""
    dataset: Path
    """Training questions (the tiny world's train.parquet)."""
    corpus: Path
    """The corpus the BM25 index is built from."""
    index_dir: Path
    """Where the BM25 index is (built from `corpus` by the launcher when missing)."""
    context: int = 2048
    """The stand-in model's context length."""
    kv_cache_gib: int = 1
    """vLLM's CPU KV cache."""


@dataclass(frozen=True)
class Difference:
    """One key whose value the rehearsal changed (`shipped` None: added; `rehearsed` None: removed)."""

    key: str
    shipped: Any
    rehearsed: Any
    reason: str


def flatten(table: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested table."""
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from flatten(v, key + ".")
        else:
            yield key, v


def _covering(key: str) -> str | None:
    """The `SWAPS` entry that covers `key` (itself or a table above it), if any."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in SWAPS:
            return ".".join(parts[:i])
    return None


def check_swaps(shipped: dict[str, Any], rehearsed: dict[str, Any]) -> list[Difference]:
    """Every difference between the two configs, each with its reason; raises `RehearsalError` naming
    the keys no swap covers."""
    a, b = dict(flatten(shipped)), dict(flatten(rehearsed))
    out, refused = [], []
    for key in sorted(a.keys() | b.keys()):
        if key in a and key in b and a[key] == b[key]:
            continue
        cover = _covering(key)
        if cover is not None:
            out.append(Difference(key, a.get(key), b.get(key), SWAPS[cover]))
        elif key not in a and key.split(".")[0] in ADDED_TABLES and key.split(".")[0] not in shipped:
            out.append(Difference(key, None, b[key], "a learner-only config: the rehearsal supplies "
                                                      f"the [{key.split('.')[0]}] table"))
        else:
            refused.append(key)
    if refused:
        raise RehearsalError(f"the rehearsal would change {', '.join(refused)}, which no swap covers "
                             "(searchr1.launcher.rehearsal.SWAPS)")
    return out


def _set(table: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    for p in path:
        table = table.setdefault(p, {})
    table[last] = value


def _get(table: dict[str, Any], key: str) -> Any:
    for p in key.split("."):
        if not isinstance(table, dict) or p not in table:
            return None
        table = table[p]
    return table


def rehearsal_config(shipped: dict[str, Any], stand_ins: StandIns, *, name: str, run_dir: Path, steps: int,
                     services: dict[str, Any] | None = None) -> dict[str, Any]:
    """The rehearsed config: `shipped` with the stand-ins swapped in (see the module docstring). A config
    without `[rollout]` gets `services`' launcher, rollout, retriever and reward tables."""
    if "learner" not in shipped:
        raise RehearsalError("a rehearsal trains the config's [learner]: this config has none")
    cfg = copy.deepcopy(shipped)
    if "rollout" not in cfg:
        if services is None:
            raise RehearsalError("a learner-only config needs the services of another config to rehearse with")
        for t in ADDED_TABLES:
            if t not in cfg and t in services:
                cfg[t] = copy.deepcopy(services[t])
    cfg.pop("placement", None)
    m = str(stand_ins.model)
    _set(cfg, "rollout.model", m)
    _set(cfg, "learner.model.path", m)
    if _get(cfg, "learner.model.critic_path") is not None:
        _set(cfg, "learner.model.critic_path", m)
    _set(cfg, "rollout.engine.max_model_len", min(stand_ins.context,
                                                  _get(cfg, "rollout.engine.max_model_len") or stand_ins.context))
    _set(cfg, "rollout.engine.gpu_memory_utilization", 0.1)
    _set(cfg, "rollout.engine.enforce_eager", True)
    if _get(cfg, "rollout.engine.tensor_parallel_size") is not None:
        _set(cfg, "rollout.engine.tensor_parallel_size", 1)
    _set(cfg, "learner.dispatcher.dataset", str(stand_ins.dataset))
    _set(cfg, "launcher.retriever.index_dir", str(stand_ins.index_dir))
    _set(cfg, "launcher.retriever.corpus", str(stand_ins.corpus))
    _set(cfg, "launcher.retriever.kind", "bm25")
    _set(cfg, "launcher.retriever.health_timeout_s", 600.0)
    if isinstance(cfg.get("retriever"), dict):
        cfg["retriever"].pop("search", None)
        cfg["retriever"]["torch_threads"] = 1
        cfg["retriever"]["faiss_threads"] = 1
    if isinstance(cfg.get("reward"), dict):
        cfg["reward"]["workers"] = 1
    _set(cfg, "launcher.rollout.workers", 1)
    _set(cfg, "launcher.rollout.env", {"VLLM_CPU_KVCACHE_SPACE": str(stand_ins.kv_cache_gib)})
    _set(cfg, "launcher.commands.learner", [sys.executable, "-m", "searchr1.learner.torchrun", "--nnodes", "1",
                                            "--nproc-per-node", "2", "-m", "searchr1.cli"])
    _set(cfg, "learner.device", "cpu")
    _set(cfg, "learner.threads", 1)
    groups = _get(cfg, "learner.batch.groups_per_step")
    inflight = _get(cfg, "learner.dispatcher.max_inflight")
    _set(cfg, "learner.batch.groups_per_step", REHEARSAL_GROUPS)
    if inflight is not None and groups:
        _set(cfg, "learner.dispatcher.max_inflight", max(1, round(REHEARSAL_GROUPS * inflight / groups)))
    _set(cfg, "launcher.run", name)
    _set(cfg, "launcher.run_dir", str(run_dir))
    _set(cfg, "launcher.learner.extra_args", ["--max-steps", str(steps)])
    return cfg


def same_rehearsal(config: dict[str, Any]) -> str:
    """A digest of what the rehearsal runs, its names and paths left out: two configs with one digest
    (3B and 7B, base and instruct, once the model is swapped) are one rehearsal. The launcher's grace is
    left out with the model: it is the model's stop budget (`searchr1.learner.stop_budget`), so it differs
    between 3B and 7B and not in what a rehearsal trains."""
    leaves = {k: v for k, v in flatten(config) if k not in NAMING_KEYS and k not in
              ("rollout.model", "learner.model.path", "learner.model.critic_path", "launcher.grace_period_s")}
    return hashlib.sha256(json.dumps(leaves, sort_keys=True, default=str).encode()).hexdigest()[:16]
