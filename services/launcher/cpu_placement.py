"""CPU cores as devices: which cores each process of a run may use, from the `cores` entries of a
`[placement]` table, and the thread settings that follow. Pure: it computes, it starts nothing.

Each role lists its cores (`[placement.learner] cores = [2, 3]`, or a range string `"8-15,24"`); the
rollout cores are cut, in the order listed, into one equal group per rollout worker. The small services
(retriever, reward service, Redis) may instead share a main role's cores (`cores_with = "rollout"`), said
out loud in the plan. When any role lists cores, every process must have some (its own, or a role's it
shares), no core may be listed twice (unless `cpu_colocate`: every process on the same cores, each phase
taking them in turn, as lockstep training runs), and every core must exist (`[placement] cpus`, else the
cores this process may run on).

What a process gets (`CoreShare`): its core set, applied by `searchr1 up` as the process's CPU affinity
(`os.sched_setaffinity` before it starts, inherited by its children: vLLM's engine process, torchrun's
ranks), and settings sized to it: the learner's torch threads (`LEARNER_THREADS`: cores per rank), the
vLLM CPU engine's OpenMP thread binding (`VLLM_CPU_OMP_THREADS_BIND`: the worker's cores; vLLM's own
default binds every engine to the first core of a NUMA node and reserves another), and the retriever's
batch threads (`RETRIEVER_BATCH_THREADS`). The deploy generators ask `cpu_resources` for the same shares:
compose's `cpuset`, and Kubernetes requests equal to limits in whole CPUs (`k8s_cpu_resources`), which the
kubelet's static CPU manager turns into exclusive cores.

Departure from Search-R1: its hybrid engine gives every phase every device in turn; here a run may do the
same (`cpu_colocate`) or give rollout and learning their own cores, so the two overlap instead of taking
turns (asynchronous training).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator

from searchr1.core.settings import Section

MAIN_ROLES = ("rollout", "learner")
SMALL_ROLES = ("retriever", "reward", "redis")
ROLES = (*MAIN_ROLES, *SMALL_ROLES)


class CorePlacementError(ValueError):
    """A core placement that cannot run; the message names the cores and roles at fault."""


def parse_cores(value: object) -> list[int]:
    """`[0, 1, 2]` or `"0-2,5"` → `[0, 1, 2, 5]` (order kept; repeats are left for the checks to name)."""
    if isinstance(value, str):
        out: list[int] = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            try:
                a, b = int(lo), int(hi) if sep else int(lo)
            except ValueError:
                raise ValueError(f"cannot read {part!r} as a core or a range of cores (e.g. \"0-3,8\")") from None
            if b < a:
                raise ValueError(f"core range {part!r} runs backwards")
            out.extend(range(a, b + 1))
        return out
    if isinstance(value, Iterable):
        return [int(v) for v in value]
    raise ValueError(f"cores must be a list of core numbers or a string like \"0-3,8\", not {value!r}")


def core_list(cores: Iterable[int]) -> str:
    """`[0, 1, 2, 5]` → `"0-2,5"` (compose's `cpuset`, vLLM's bind list)."""
    ordered = sorted(set(cores))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


class CoresMixin(Section):
    cores: list[int] = Field(default_factory=list)
    """CPU cores of this role (a list, or a string of ranges such as "0-3,8"); empty: none of its own."""

    @field_validator("cores", mode="before")
    @classmethod
    def _read_cores(cls, value: object) -> list[int]:
        cores = parse_cores(value)
        if any(c < 0 for c in cores):
            raise ValueError(f"core numbers are 0 or more, got {cores}")
        return cores


class SmallServicePlacement(CoresMixin):
    cores_with: Literal["rollout", "learner"] | None = None
    """Share the cores of this role instead of listing its own (the small services beside the side they
    serve: the retriever and reward service with the rollout workers)."""


@dataclass(frozen=True)
class CoreShare:
    """One process's cores."""

    cores: tuple[int, ...]
    with_role: str | None = None
    """The role whose cores it shares (`cores_with`), or None for cores of its own."""

    @property
    def count(self) -> int:
        return len(self.cores)

    @property
    def cpuset(self) -> str:
        return core_list(self.cores)


def _check(role: str, cores: list[int], exists: frozenset[int]) -> None:
    missing = sorted(set(cores) - exists)
    if missing:
        raise CorePlacementError(f"{role} cores {missing} do not exist here: the node has cores "
                                 f"{core_list(exists) or 'none'}")
    dup = sorted({c for c in cores if cores.count(c) > 1})
    if dup:
        raise CorePlacementError(f"{role} lists cores {dup} more than once")


def plan_cores(own: Mapping[str, list[int]], shared: Mapping[str, str | None], workers: int,
               exists: Iterable[int], *, colocate: bool) -> dict[str, CoreShare]:
    """Each process's cores: `own` maps a role (`rollout`, `learner`, `retriever`, `reward`, `redis`) to
    the cores it lists, `shared` a small role to the main role whose cores it shares (or None), `workers`
    is how many rollout workers the rollout cores are cut into, `exists` the node's cores. Keys of the
    result: `rollout-0` … `rollout-{workers-1}`, `learner`, `retriever`, `reward`, `redis`. Raises
    `CorePlacementError` naming what is wrong (see the module docstring)."""
    exists = frozenset(exists)
    for role in (*MAIN_ROLES, *SMALL_ROLES):
        cores, partner = own.get(role, []), shared.get(role)
        _check(role, cores, exists)
        if cores and partner:
            raise CorePlacementError(f"{role} has both cores {cores} and cores_with = {partner!r}: give one")
        if not cores and not partner:
            where = (f"[placement.{role}] cores" if role in MAIN_ROLES
                     else f"[placement.{role}] cores, or cores_with = \"rollout\"")
            raise CorePlacementError(f"{role} has no cores: every process needs some once any role lists "
                                     f"cores ({where})")
    if not colocate:
        seen: dict[int, str] = {}
        for role in (*MAIN_ROLES, *SMALL_ROLES):
            for c in own.get(role, []):
                if c in seen:
                    raise CorePlacementError(f"core {c} is given to both {seen[c]} and {role}; give each role its "
                                             "own cores, share with cores_with, or set cpu_colocate = true")
                seen[c] = role
    rollout = own["rollout"]
    if workers < 1 or len(rollout) % workers:
        raise CorePlacementError(f"{len(rollout)} rollout cores cannot be cut into {workers} equal group(s), one "
                                 "per rollout worker")
    per = len(rollout) // workers
    out = {f"rollout-{i}": CoreShare(tuple(rollout[i * per:(i + 1) * per])) for i in range(workers)}
    out["learner"] = CoreShare(tuple(own["learner"]))
    for role in SMALL_ROLES:
        partner = shared.get(role)
        out[role] = CoreShare(tuple(own[partner]), partner) if partner else CoreShare(tuple(own[role]))
    return out


def lists_cores(s: Any) -> bool:
    """Whether any role of a `PlacementSettings` lists cores (or shares another's)."""
    return any(getattr(s, r).cores for r in ROLES) or any(getattr(s, r).cores_with for r in SMALL_ROLES)


def node_cores(cpus: int | None, cores_here: set[int] | None = None) -> set[int]:
    """The cores that exist: 0 … cpus-1, else `cores_here`, else the cores this process may run on."""
    if cpus is not None:
        return set(range(cpus))
    if cores_here is not None:
        return set(cores_here)
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def shares_for(s: Any, workers: int, cores_here: set[int] | None = None) -> dict[str, CoreShare]:
    """`plan_cores` for a `PlacementSettings`: its roles' `cores` and `cores_with`, `cpus`, `cpu_colocate`."""
    return plan_cores({r: getattr(s, r).cores for r in ROLES}, {r: getattr(s, r).cores_with for r in SMALL_ROLES},
                      workers, node_cores(s.cpus, cores_here), colocate=s.cpu_colocate)


def core_env(name: str, share: CoreShare, learner_ranks: int = 1) -> dict[str, str]:
    """The settings a process's cores decide (environment overrides of its service settings)."""
    if name.startswith("rollout-"):
        return {"VLLM_CPU_OMP_THREADS_BIND": share.cpuset}
    if name == "learner":
        return {"LEARNER_THREADS": str(max(1, share.count // max(1, learner_ranks)))}
    if name == "retriever":
        return {"RETRIEVER_BATCH_THREADS": str(share.count)}
    return {}


def thread_overflows(config: Mapping[str, object], shares: Mapping[str, CoreShare]) -> list[str]:
    """Thread counts in the run config's service tables that exceed the cores the placement gives that
    process (`[retriever] torch_threads`/`faiss_threads`, `[rollout.engine] hf_threads`): threads beyond
    a process's cores only wait for each other."""
    out: list[str] = []
    checks = (("retriever", ("retriever",), ("torch_threads", "faiss_threads")),
              ("rollout-0", ("rollout", "engine"), ("hf_threads",)))
    for name, path, keys in checks:
        share = shares.get(name)
        table: object = config
        for part in path:
            table = table.get(part, {}) if isinstance(table, Mapping) else {}
        if share is None or not isinstance(table, Mapping):
            continue
        for key in keys:
            value = table.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > share.count:
                out.append(f"[{'.'.join(path)}] {key} = {value} but [placement] gives {name} {share.count} core(s) "
                           f"({share.cpuset}): use at most {share.count}")
    return out


def cpu_resources(shares: Mapping[str, CoreShare]) -> dict[str, dict[str, object]]:
    """Per process (`rollout-i`, `learner`, …): `cpuset` (compose's string of cores) and `cpus` (how many),
    for the deploy generators."""
    return {name: {"cpuset": s.cpuset, "cpus": s.count} for name, s in shares.items()}


def k8s_cpu_resources(count: int) -> dict[str, dict[str, object]]:
    """Container resources that the kubelet's static CPU manager pins to `count` exclusive cores: whole
    CPUs, requests equal to limits. The pod must be Guaranteed: every container (init containers too) with
    CPU and memory requests equal to limits; a memory request left out defaults to the limit, so the
    request is removed (`null` deletes it in a strategic-merge patch) and the base's limit stands."""
    cpu = str(int(count))
    return {"requests": {"cpu": cpu, "memory": None}, "limits": {"cpu": cpu}}


def placement_cpu_resources(placed: Any) -> dict[str, dict[str, object]]:
    """Per process of a `Placement` with cores (`rollout-i`, `learner`, `retriever`, `reward`, `redis`):
    its `cpuset` (compose) and `cpus` (how many: Kubernetes' whole-CPU requests), for the deploy
    generators. Empty when the placement lists no cores."""
    return cpu_resources({name: p.cores for name, p in placed.by_name().items() if p.cores is not None})


K8S_NODE_LOCAL_ENV = ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_OMP_THREADS_BIND")
"""Placement variables that name the node's own device numbers: in a pod the device plugin and the CPU
manager choose the devices and cores, so the Kubernetes patch leaves these out (vLLM then binds within the
cores the pod was given)."""
K8S_INIT_CONTAINER = "wait-for-data"
"""The base's init container in the rollout, learner and retriever pods (it must be Guaranteed too)."""


def k8s_pin(container: dict[str, Any], pod: dict[str, Any], share: CoreShare | None, init: bool = True) -> None:
    """Give `container` whole CPUs for `share`, requests equal to limits (kept: its other limits, e.g.
    GPUs), and `pod`'s init container a Guaranteed budget, so the static CPU manager pins the pod's cores
    (`k8s_cpu_resources`). Nothing without a share."""
    if share is None:
        return
    res = k8s_cpu_resources(share.count)
    limits = {**container.get("resources", {}).get("limits", {}), **res["limits"]}
    container["resources"] = {"requests": res["requests"], "limits": limits}
    if init:
        pod["initContainers"] = [{"name": K8S_INIT_CONTAINER, "resources": {
            "requests": {"cpu": "10m", "memory": None}, "limits": {"cpu": "10m"}}}]


def k8s_with_cores(docs: list[dict[str, Any]], placed: Any) -> list[dict[str, Any]]:
    """The Kubernetes placement patch's workloads (`rollout`, `learner-k8s`, `retriever`) with their
    processes' cores as whole CPUs (`k8s_pin`), less the node-local variables (`K8S_NODE_LOCAL_ENV`), plus
    the reward service's and Redis's Deployments when they have cores; `docs` unchanged without cores."""
    procs = {"rollout": placed.rollout[0], "learner-k8s": placed.learner, "retriever": placed.retriever}
    for doc in docs:
        proc = procs.get(doc["metadata"]["name"])
        if proc is None or proc.cores is None:
            continue
        pod = doc["spec"]["template"]["spec"]
        container = pod["containers"][0]
        container["env"] = [e for e in container.get("env", []) if e["name"] not in K8S_NODE_LOCAL_ENV]
        k8s_pin(container, pod, proc.cores)
    for small in (placed.reward, placed.redis):
        if small is not None and small.cores is not None:
            container: dict[str, Any] = {"name": small.name}
            k8s_pin(container, {}, small.cores, init=False)
            docs.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": small.name},
                         "spec": {"template": {"spec": {"containers": [container]}}}})
    return docs
