"""Placement of one run on one node: from a `[placement]` table, which GPUs and CPU cores (planned by
`cpu_placement`) each process uses and the arguments that follow. Pure: it computes, it starts nothing.

For each process it gives `CUDA_VISIBLE_DEVICES` and the environment overrides of that service's
settings (vLLM's `tensor_parallel_size` and `gpu_memory_utilization` for each rollout worker, the
retriever's device), and for the learner the `torchrun` command prefix (`--nproc_per_node`, master
address and port) that starts its FSDP ranks. The rollout GPUs are cut, in the order listed, into
groups of `tensor_parallel_size`, one vLLM worker per group.

The placement decides these settings: `placement_conflicts` lists the run config's service-table values
that say otherwise (`[retriever.search] faiss_gpu = true` beside `[placement.retriever] faiss_gpu = false`),
which every consumer of a placement (`searchr1 up`, `searchr1 deploy compose|k8s`) refuses rather
than override without a word.

Errors are raised for a GPU out of range, a GPU listed twice, GPUs shared between roles (unless
`colocate`: the learner and the rollout workers on the same GPUs, as Search-R1 runs them), a rollout GPU
count that the tensor-parallel size does not divide, and ports that collide.

Departure from Search-R1: Search-R1 (veRL's hybrid engine) puts the actor, reference and vLLM rollout on
every GPU in turn; here the rollout workers and the learner are separate processes that may run side by
side on disjoint GPUs (the default) or share them (`colocate`, with vLLM's memory fraction leaving the
rest to FSDP). What it does not do: start processes or pick free ports (`searchr1.launcher.specs`).

The same placement is written as deployment files by `searchr1.deploy` (`searchr1 deploy compose|k8s`):
a compose project for one node (each process's GPUs and cpuset) and the Kubernetes gpu overlays'
placement patch (GPUs, and cores as whole CPUs with requests = limits).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from searchr1.core.settings import ServiceSettings
from searchr1.launcher.cpu_placement import (
    CorePlacementError,
    CoreShare,
    CoresMixin,
    SmallServicePlacement,
    core_env,
    lists_cores,
    shares_for,
    thread_overflows,
)

__all__ = ["PlacementError", "PlacementSettings", "Placement", "ProcessPlacement", "plan_placement",
           "placement_conflicts", "LEARNER_SHM", "TORCHRUN"]


TORCHRUN = ("python", "-m", "searchr1.learner.torchrun")
"""How the learner's FSDP ranks are started: torchrun, with its shutdown timeout honoured on every torch
the images pin (`searchr1.learner.torchrun`; `searchr1 up` runs it with its own interpreter)."""


class PlacementError(ValueError):
    """A placement that cannot run; the message names the GPUs, cores or ports at fault."""


class RolloutPlacement(CoresMixin):
    workers: int | None = Field(default=None, ge=1, le=64)
    """Workers of a placement without GPUs, the rollout cores cut evenly (None: `[launcher.rollout] workers`)."""
    gpus: list[int] = Field(default_factory=list)
    """GPU indices the vLLM workers use, cut in this order into groups of `tensor_parallel_size`."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """GPUs one vLLM engine spans (`rollout.engine.tensor_parallel_size`)."""
    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=1.0)
    """Fraction of each GPU's memory vLLM reserves (`rollout.engine.gpu_memory_utilization`); with
    `colocate` it must leave room for the learner (Search-R1 runs 0.6)."""
    vllm_port: int | None = Field(default=None, ge=1024, le=65535)
    """First port of vLLM's own distributed set-up (`VLLM_PORT`); worker i gets `vllm_port + 100·i`
    (None: vLLM picks free ports)."""


class LearnerPlacement(CoresMixin):
    gpus: list[int] = Field(default_factory=list)
    """GPU indices of the learner's FSDP ranks, one rank per GPU, started by torchrun."""
    master_addr: str = "127.0.0.1"
    """torchrun `--master_addr` (one node: loopback)."""
    master_port: int = Field(default=29500, ge=1024, le=65535)
    """torchrun `--master_port`."""


class RetrieverPlacement(SmallServicePlacement):
    device: Literal["cpu", "gpu"] = "cpu"
    """Where the query encoder (and, with `faiss_gpu`, the FAISS index) runs."""
    gpu: int | None = Field(default=None, ge=0)
    """The GPU index when `device = "gpu"`."""
    faiss_gpu: bool = False
    """Also put the FAISS index on that GPU: the one switch for FAISS on GPU in a config with a placement
    (it sets `retriever.search.faiss_gpu`; needs an image built with `FAISS=gpu`; the 61 GiB wiki-18 Flat
    index does not fit one 80 GB GPU next to anything else)."""


class PlacementSettings(ServiceSettings):
    """Settings of the run's placement: table `[placement]` of the run config, env prefix `PLACEMENT_`."""

    model_config = ServiceSettings.model_config | {"env_prefix": "PLACEMENT_"}
    section: ClassVar[str] = "placement"

    gpus: int = Field(default=8, ge=1, le=64)
    """GPUs on the node (indices 0 … gpus-1)."""
    colocate: bool = False
    """Let the learner and the rollout workers share GPUs (vLLM takes `gpu_memory_utilization` of each)."""
    cpus: int | None = Field(default=None, ge=1, le=4096)
    """CPU cores on the node (0 … cpus-1), for the roles' `cores`; None: the cores this process may run
    on (its affinity)."""
    cpu_colocate: bool = False
    """Let processes list the same cores (lockstep training colocated: each phase takes every core in
    turn); without it no core may be given twice."""
    rollout: RolloutPlacement = Field(default_factory=RolloutPlacement)
    """The vLLM rollout workers."""
    learner: LearnerPlacement = Field(default_factory=LearnerPlacement)
    """The learner's FSDP ranks."""
    retriever: RetrieverPlacement = Field(default_factory=RetrieverPlacement)
    """The retriever."""
    reward: SmallServicePlacement = Field(default_factory=SmallServicePlacement)
    """The reward service (cores only)."""
    redis: SmallServicePlacement = Field(default_factory=SmallServicePlacement)
    """The Redis server `searchr1 up` starts (cores only)."""

    @model_validator(mode="after")
    def _gpu_needs_index(self) -> PlacementSettings:
        if self.retriever.device == "gpu" and self.retriever.gpu is None:
            raise ValueError("retriever.device = 'gpu' needs retriever.gpu (a GPU index)")
        if self.retriever.device == "cpu" and (self.retriever.gpu is not None or self.retriever.faiss_gpu):
            raise ValueError("retriever.gpu / retriever.faiss_gpu need retriever.device = 'gpu'")
        return self


@dataclass(frozen=True)
class ProcessPlacement:
    """One process's share of the node."""

    name: str
    """`rollout-{i}`, `learner`, `retriever`, `reward` or `redis` (the launcher's process names)."""
    gpus: tuple[int, ...]
    """Physical GPU indices it sees (empty: CPU only)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment to set: `CUDA_VISIBLE_DEVICES` (empty string hides every GPU) and settings overrides."""
    command_prefix: tuple[str, ...] = ()
    """Program and arguments before `-m searchr1.cli …` (`TORCHRUN` for the learner; empty: the interpreter)."""
    cores: CoreShare | None = None
    """Its CPU cores (None: no core placement; the OS decides)."""

    @property
    def cuda_visible_devices(self) -> str:
        return self.env.get("CUDA_VISIBLE_DEVICES", "all")


@dataclass(frozen=True)
class Placement:
    rollout: tuple[ProcessPlacement, ...]
    learner: ProcessPlacement
    retriever: ProcessPlacement
    reward: ProcessPlacement | None = None
    """Only with cores (the reward service and Redis use no GPU)."""
    redis: ProcessPlacement | None = None

    @property
    def places_gpus(self) -> bool:
        return bool(self.learner.gpus)

    @property
    def places_cores(self) -> bool:
        return self.learner.cores is not None

    def by_name(self) -> dict[str, ProcessPlacement]:
        procs = (*self.rollout, self.learner, self.retriever, self.reward, self.redis)
        return {p.name: p for p in procs if p is not None}


def _devices(gpus: tuple[int, ...]) -> str:
    return ",".join(str(g) for g in gpus)


def _check_gpus(role: str, gpus: list[int], n: int) -> None:
    bad = [g for g in gpus if not 0 <= g < n]
    if bad:
        raise PlacementError(f"{role} GPUs {bad} are out of range: the node has GPUs 0..{n - 1}")
    dup = sorted({g for g in gpus if gpus.count(g) > 1})
    if dup:
        raise PlacementError(f"{role} lists GPUs {dup} more than once")


def plan_placement(s: PlacementSettings, workers: int = 1, cores_here: set[int] | None = None) -> Placement:
    """Each process's GPUs, cores, environment and (learner) torchrun prefix. `workers`: the rollout
    workers of a placement without GPUs (unless `[placement.rollout] workers` says); `cores_here`: the
    cores that exist when `[placement] cpus` is not set (default: this process's affinity)."""
    gpu_part = bool(s.rollout.gpus or s.learner.gpus or s.retriever.device == "gpu")
    if not gpu_part and not lists_cores(s):
        raise PlacementError("[placement] places nothing: list GPUs (rollout.gpus, learner.gpus) or cores "
                             "(rollout.cores, learner.cores, …)")
    placed = _plan_gpus(s) if gpu_part else Placement(
        tuple(ProcessPlacement(f"rollout-{i}", ()) for i in range(s.rollout.workers or workers)),
        ProcessPlacement("learner", ()), ProcessPlacement("retriever", ()))
    if not lists_cores(s):
        return placed
    if gpu_part and s.rollout.workers is not None and s.rollout.workers != len(placed.rollout):
        raise PlacementError(f"rollout.workers = {s.rollout.workers} but rollout.gpus make {len(placed.rollout)} "
                             "vLLM worker(s); drop rollout.workers")
    try:
        shares = shares_for(s, len(placed.rollout), cores_here)
    except CorePlacementError as exc:
        raise PlacementError(str(exc)) from None
    ranks = max(1, len(placed.learner.gpus))

    def with_cores(p: ProcessPlacement) -> ProcessPlacement:
        return replace(p, env={**p.env, **core_env(p.name, shares[p.name], ranks)}, cores=shares[p.name])

    return Placement(tuple(with_cores(w) for w in placed.rollout), with_cores(placed.learner),
                     with_cores(placed.retriever), with_cores(ProcessPlacement("reward", ())),
                     with_cores(ProcessPlacement("redis", ())))


def _plan_gpus(s: PlacementSettings) -> Placement:
    """Each process's GPUs, environment and (learner) torchrun prefix; see the module docstring."""
    r, lr, ret = s.rollout, s.learner, s.retriever
    if not r.gpus:
        raise PlacementError("rollout.gpus is empty: the vLLM workers need at least one GPU")
    if not lr.gpus:
        raise PlacementError("learner.gpus is empty: the learner needs at least one GPU")
    _check_gpus("rollout", r.gpus, s.gpus)
    _check_gpus("learner", lr.gpus, s.gpus)
    ret_gpus = [ret.gpu] if ret.device == "gpu" and ret.gpu is not None else []
    _check_gpus("retriever", ret_gpus, s.gpus)
    shared = sorted(set(r.gpus) & set(lr.gpus))
    if shared and not s.colocate:
        raise PlacementError(f"GPUs {shared} are given to both the rollout workers and the learner; "
                             "give them disjoint GPUs or set colocate = true")
    if s.colocate and r.gpu_memory_utilization > 0.9:
        raise PlacementError(f"colocate with rollout.gpu_memory_utilization = {r.gpu_memory_utilization} "
                             "leaves the learner no room; use at most 0.9 (Search-R1 runs 0.6)")
    busy = set(r.gpus) | set(lr.gpus)
    if ret_gpus and ret_gpus[0] in busy and not s.colocate:
        raise PlacementError(f"retriever GPU {ret_gpus[0]} is also given to the rollout workers or the learner; "
                             "pick a free GPU, run it on CPU, or set colocate = true")
    tp = r.tensor_parallel_size
    if len(r.gpus) % tp:
        raise PlacementError(f"{len(r.gpus)} rollout GPUs cannot be cut into groups of tensor_parallel_size {tp}")

    workers = len(r.gpus) // tp
    ports = {lr.master_port: "learner.master_port"}
    rollout = []
    for i in range(workers):
        group = tuple(r.gpus[i * tp:(i + 1) * tp])
        env = {"CUDA_VISIBLE_DEVICES": _devices(group),
               "ROLLOUT_ENGINE__TENSOR_PARALLEL_SIZE": str(tp),
               "ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION": str(r.gpu_memory_utilization)}
        if r.vllm_port is not None:
            port = r.vllm_port + 100 * i
            if port > 65535 or port in ports:
                raise PlacementError(f"rollout-{i}'s vLLM port {port} is out of range or taken by "
                                     f"{ports.get(port, 'nothing valid')}")
            ports[port] = f"rollout-{i} vLLM port"
            env["VLLM_PORT"] = str(port)
        rollout.append(ProcessPlacement(f"rollout-{i}", group, env))

    lgpus = tuple(lr.gpus)
    learner = ProcessPlacement(
        "learner", lgpus, {"CUDA_VISIBLE_DEVICES": _devices(lgpus), "LEARNER_DEVICE": "cuda"},
        (*TORCHRUN, "--nnodes", "1", "--nproc_per_node", str(len(lgpus)), "--master_addr", lr.master_addr,
         "--master_port", str(lr.master_port)))

    if ret_gpus:
        retriever = ProcessPlacement("retriever", (ret_gpus[0],), {
            "CUDA_VISIBLE_DEVICES": str(ret_gpus[0]), "RETRIEVER_SEARCH__DEVICE": "cuda",
            "RETRIEVER_SEARCH__FAISS_GPU": "true" if ret.faiss_gpu else "false"})
    else:
        retriever = ProcessPlacement("retriever", (), {"CUDA_VISIBLE_DEVICES": "", "RETRIEVER_SEARCH__DEVICE": "cpu",
                                                       "RETRIEVER_SEARCH__FAISS_GPU": "false"})
    return Placement(tuple(rollout), learner, retriever)


SERVICE_PREFIXES = {"ROLLOUT_": "rollout", "LEARNER_": "learner", "RETRIEVER_": "retriever"}
"""Environment prefixes of the service settings a placement sets, and their tables in the run config."""
DECIDED_BY = {"ROLLOUT_ENGINE__TENSOR_PARALLEL_SIZE": "[placement.rollout] tensor_parallel_size",
              "ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION": "[placement.rollout] gpu_memory_utilization",
              "LEARNER_DEVICE": "[placement.learner] gpus", "RETRIEVER_SEARCH__DEVICE": "[placement.retriever] device",
              "RETRIEVER_SEARCH__FAISS_GPU": "[placement.retriever] faiss_gpu",
              "LEARNER_THREADS": "[placement.learner] cores", "RETRIEVER_BATCH_THREADS": "[placement.retriever] cores"}
"""The `[placement]` entry each service setting follows from."""


def _same(configured: Any, placed: str) -> bool:
    if isinstance(configured, bool):
        return str(configured).lower() == placed
    if isinstance(configured, int | float):
        try:
            return float(configured) == float(placed)
        except ValueError:
            return False
    return str(configured) == placed


def placement_conflicts(config: dict[str, Any], placed: Placement) -> list[str]:
    """The run config's service-table values that `placed` also sets, with another value (`config`: the
    run config's tables). The placement decides them; a differing value in a service table would be
    overridden without a word, so each is a refusal naming both (an agreeing one is accepted)."""
    out: list[str] = []
    for proc in placed.by_name().values():
        for key, value in proc.env.items():
            prefix = next((p for p in SERVICE_PREFIXES if key.startswith(p)), None)
            if prefix is None:
                continue
            path = [SERVICE_PREFIXES[prefix], *key[len(prefix):].lower().split("__")]
            table: Any = config
            for part in path[:-1]:
                table = table.get(part, {}) if isinstance(table, dict) else {}
            if not isinstance(table, dict) or path[-1] not in table or _same(table[path[-1]], value):
                continue
            line = (f"[{'.'.join(path[:-1])}] {path[-1]} = {json.dumps(table[path[-1]])} but the placement sets it "
                    f"to {value} ({key}, from {DECIDED_BY.get(key, '[placement]')}): drop the line, the placement "
                    "decides it")
            if line not in out:
                out.append(line)
    shares = {name: p.cores for name, p in placed.by_name().items() if p.cores is not None}
    return out + thread_overflows(config, shares)


LEARNER_SHM = "8Gi"
"""Size of the learner pod's /dev/shm when it runs more than one rank (NCCL's shared-memory transport)."""
