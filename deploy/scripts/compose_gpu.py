"""docker-compose.gpu.yml from a run config's [placement] table: one compose service per vLLM worker
(`rollout-gpu-0`, `rollout-gpu-1`, …) and one for the learner's FSDP ranks (`learner-gpus`), each given
exactly its GPUs by `device_ids`, as `searchr1 up` and the Kubernetes gpu overlay place them.

    python deploy/scripts/compose_gpu.py configs/searchr1-3b-grpo.toml > docker-compose.gpu.yml
    docker compose -f docker-compose.yml -f docker-compose.gpu.yml up -d --scale rollout=0 --scale learner=0

Each service is a complete copy of docker-compose.yml's `rollout-gpu` / `learner-gpu` (no `extends`, so
no list is merged and no GPU is inherited), without their `gpu` profile, with the placement's settings
in the environment (tensor-parallel size, memory fraction, vLLM port) and the learner started under
torchrun. The network aliases `rollout` and `learner` keep Prometheus' DNS discovery finding them.
The retriever stays on the CPU here (the compose file's retriever has no GPU).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _gpu(devices: tuple[int, ...]) -> dict[str, Any]:
    return {"resources": {"reservations": {"devices": [
        {"driver": "nvidia", "device_ids": [str(d) for d in devices], "capabilities": ["gpu"]}]}}}


def _service(template: dict[str, Any], alias: str, devices: tuple[int, ...], env: dict[str, str]) -> dict[str, Any]:
    s = copy.deepcopy(template)
    s.pop("profiles", None)
    s.pop("build", None)  # built once as SEARCHR1_GPU_IMAGE (make image-cuda)
    s["environment"] = {**s.get("environment", {}),
                        **{k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}}
    s["networks"] = {"default": {"aliases": [alias]}}
    s["deploy"] = _gpu(devices)
    return s


def compose_gpu(settings, base: dict[str, Any], source: str = "") -> str:
    """The override file (YAML text) for `settings` (PlacementSettings) over the compose file `base`."""
    from searchr1.launcher.placement import LEARNER_SHM, plan_placement

    plan = plan_placement(settings)
    services: dict[str, Any] = {}
    for i, worker in enumerate(plan.rollout):
        services[f"rollout-gpu-{i}"] = _service(base["services"]["rollout-gpu"], "rollout", worker.gpus, worker.env)
    learner = _service(base["services"]["learner-gpu"], "learner", plan.learner.gpus, plan.learner.env)
    learner["entrypoint"] = [*plan.learner.command_prefix, "-m", "searchr1.cli"]
    if len(plan.learner.gpus) > 1:
        learner["shm_size"] = LEARNER_SHM.replace("Gi", "gb")  # NCCL's shared-memory transport
    services["learner-gpus"] = learner
    groups = " | ".join(w.cuda_visible_devices for w in plan.rollout)
    head = (f"# Generated from the [placement] table of {source or 'a run config'} by\n"
            f"#   python deploy/scripts/compose_gpu.py {source or '<config>'} > docker-compose.gpu.yml\n"
            f"# {len(plan.rollout)} vLLM worker(s) on GPUs {groups}; the learner's {len(plan.learner.gpus)} FSDP "
            f"rank(s) on GPUs {plan.learner.cuda_visible_devices}.\n"
            "# Use: docker compose -f docker-compose.yml -f docker-compose.gpu.yml up -d --scale rollout=0 "
            "--scale learner=0\n")
    return head + yaml.safe_dump({"services": services}, sort_keys=False, default_flow_style=False, width=110)


def main(argv: list[str]) -> None:
    from searchr1.core.settings import load_settings
    from searchr1.launcher.placement import PlacementSettings

    if len(argv) != 1:
        sys.exit("usage: python deploy/scripts/compose_gpu.py <run config with a [placement] table>")
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    sys.stdout.write(compose_gpu(load_settings(PlacementSettings, argv[0]), base, argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
