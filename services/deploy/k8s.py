"""`searchr1 deploy k8s CONFIG`: the kustomize patch that places a run config's processes on a GPU
cluster (deploy/k8s/overlays/gpu/placement.yaml for configs/searchr1-3b-grpo.toml, gpu-7b's for the 7B
config), from the same plan as the compose project (`plan.py`).

It sets what the placement decides, per workload (`_workload`, the one place a process's resources become
Kubernetes keys): the rollout Deployment's GPUs per worker (its tensor-parallel size) and vLLM settings,
the learner Job's GPUs (one per FSDP rank) under the same `searchr1.learner.torchrun` prefix `searchr1 up`
uses, an in-memory /dev/shm for NCCL, and the learner's stop grace (the pod's
`terminationGracePeriodSeconds`, torchrun's `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`), and the retriever
Deployment on one GPU or none; with `[placement] cores`, each process's cores as whole CPUs, requests =
limits (`searchr1.launcher.cpu_placement.k8s_with_cores`). `CUDA_VISIBLE_DEVICES` is left out: the device plugin gives each container
its GPUs, numbered from 0. GPU pods select no node label: asking for `nvidia.com/gpu` already confines them
to nodes whose device plugin offers GPUs (with or without the GPU Operator's `nvidia.com/gpu.present`
label); they tolerate the `nvidia.com/gpu` taint. The number of rollout workers is not a replica count
here: KEDA (or the HPA) owns the Deployment's replicas, and a `replicas:` in the manifest would undo its
scaling at every apply; the overlay sets the autoscaler's ceiling to the workers the placement has.
"""

from __future__ import annotations

from typing import Any

import yaml

from searchr1.deploy.plan import DeployPlan

__all__ = ["k8s_placement_patch", "GPU_TOLERATION"]

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _env(proc: Any, extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    env = {k: v for k, v in proc.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(extra or {})
    return [{"name": k, "value": v} for k, v in env.items()]


def _workload(kind: str, name: str, container: dict[str, Any], gpus: int, pod: dict[str, Any] | None = None,
              container_name: str | None = None) -> dict[str, Any]:
    """A strategic-merge patch of one workload: `container` plus `gpus` GPUs (and the GPU taint's
    toleration), the pod fields in `pod`."""
    spec_pod = dict(pod or {})
    if gpus:
        container = {**container, "resources": {"limits": {"nvidia.com/gpu": gpus}}}
        spec_pod["tolerations"] = [dict(GPU_TOLERATION)]
    api = "batch/v1" if kind == "Job" else "apps/v1"
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name},
            "spec": {"template": {"spec": {**spec_pod, "containers": [{"name": container_name or name, **container}]}}}}


def k8s_placement_patch(plan: DeployPlan) -> str:
    """The kustomize strategic-merge patch (multi-document YAML) placing the rollout Deployment, the learner
    Job (`learner-k8s`, the base's name, which the overlay's run replaces after its patches) and the
    retriever Deployment as `plan.placed` does on one node."""
    from searchr1.launcher.cpu_placement import k8s_with_cores
    from searchr1.launcher.placement import LEARNER_SHM

    p, s = plan.placed, plan.settings
    workers, tp = len(p.rollout), s.rollout.tensor_parallel_size
    rollout_env = [e for e in _env(p.rollout[0]) if e["name"] != "VLLM_PORT"]
    if s.rollout.vllm_port is not None:  # each pod has its own network: every worker takes the first port
        rollout_env.append({"name": "VLLM_PORT", "value": str(s.rollout.vllm_port)})
    ranks = len(p.learner.gpus)
    learner: dict[str, Any] = {"command": [*p.learner.command_prefix, "-m", "searchr1.cli"],
                               "env": _env(p.learner, plan.learner_env())}
    learner_pod: dict[str, Any] = {"terminationGracePeriodSeconds": plan.stop_grace_s}
    if ranks > 1:
        learner["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
        learner_pod["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": LEARNER_SHM}}]
    docs = [
        _workload("Deployment", "rollout", {"env": rollout_env}, tp),
        _workload("Job", "learner-k8s", learner, ranks, learner_pod, container_name="learner"),
        _workload("Deployment", "retriever", {"env": _env(p.retriever)}, len(p.retriever.gpus)),
    ]
    docs = k8s_with_cores(docs, p)  # the placement's cores, if it lists them: whole CPUs, requests = limits
    rgpus = " | ".join(w.cuda_visible_devices for w in p.rollout)
    head = "".join(f"# {line}\n" for line in [
        f"Generated from the [placement] table of {plan.source} by",
        f"  searchr1 deploy k8s {plan.source} --out <this file>",
        f"{workers} vLLM worker(s) (GPUs {rgpus} under `searchr1 up`; the autoscaler's ceiling is the overlay's), "
        f"{tp} GPU(s) each;",
        f"the learner's {ranks} FSDP rank(s) under torchrun; the retriever on {'one GPU' if p.retriever.gpus else 'CPU'}.",
        f"The learner's stop grace: {plan.shutdown_timeout_s} s for its ranks (TORCH_ELASTIC_SHUTDOWN_TIMEOUT), "
        f"{plan.stop_grace_s} s for the pod:",
        f"  {plan.grace.explain()}.",
        "Edit the config and regenerate; do not edit by hand."])
    body = "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=None, width=110) for d in docs)
    return head + body
