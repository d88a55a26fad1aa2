"""The Kubernetes gpu overlays place the services as `searchr1 up` does with their configs
(configs/searchr1-3b-grpo.toml in `gpu`, configs/searchr1-7b-grpo.toml in `gpu-7b`, one 8-GPU node each).

Each overlay's placement.yaml is `searchr1 deploy k8s CONFIG` (byte for byte), and the rendered overlay
(`kubectl kustomize`) agrees with `plan_placement`: the autoscaler's ceiling = vLLM workers (the Deployment
names no replica count: KEDA owns it), GPUs per worker = tensor-parallel size, the vLLM memory fraction,
the learner's GPU count, torchrun command and stop grace, the retriever's device. Strict schema validation
of the overlays is tests/unit/test_deploy.py's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from searchr1.deploy.k8s import k8s_placement_patch
from searchr1.deploy.plan import deploy_plan
from searchr1.launcher.placement import LEARNER_SHM, PlacementSettings, plan_placement

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/searchr1-3b-grpo.toml"
OVERLAY = ROOT / "deploy/k8s/overlays/gpu"
CONFIGS = {"gpu": CONFIG, "gpu-7b": "configs/searchr1-7b-grpo.toml"}


@pytest.fixture(scope="module")
def settings() -> PlacementSettings:
    return deploy_plan(ROOT / CONFIG).settings


@pytest.fixture(scope="module")
def rendered() -> dict[tuple[str, str], dict]:
    kubectl = shutil.which("kubectl") or shutil.which("kubectl", path=str(Path(sys.executable).parent))
    if not kubectl:
        pytest.skip("kubectl is not installed (dev extra)")
    done = subprocess.run([kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}


def _container(doc: dict) -> dict:
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    return c


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _placed_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in ("CUDA_VISIBLE_DEVICES", "VLLM_PORT")}


@pytest.mark.parametrize("overlay", sorted(CONFIGS))
def test_placement_patch_is_generated_from_the_config(overlay):
    config, path = CONFIGS[overlay], ROOT / "deploy/k8s/overlays" / overlay
    expected = k8s_placement_patch(deploy_plan(ROOT / config, source=config))
    assert (path / "placement.yaml").read_text() == expected, (
        f"deploy/k8s/overlays/{overlay}/placement.yaml is stale: searchr1 deploy k8s {config} "
        f"--out deploy/k8s/overlays/{overlay}/placement.yaml")
    assert config in (path / "kustomization.yaml").read_text().split("apiVersion")[0]


def test_rollout_matches_the_placement(settings, rendered):
    plan = plan_placement(settings)
    workers = len(plan.rollout)
    assert workers == 3
    deploy = rendered[("Deployment", "rollout")]
    assert "replicas" not in deploy["spec"]  # KEDA's to set: a count here would undo its scaling at every apply
    scaled = rendered[("ScaledObject", "rollout")]["spec"]
    assert scaled["minReplicaCount"] == 0 and scaled["maxReplicaCount"] == workers  # zero once the run ends
    c = _container(deploy)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == settings.rollout.tensor_parallel_size
    assert all(len(w.gpus) == settings.rollout.tensor_parallel_size for w in plan.rollout)
    env = _env(c)
    for w in plan.rollout:
        assert _placed_env(w.env).items() <= env.items(), w.name
    assert float(env["ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION"]) == settings.rollout.gpu_memory_utilization
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert env.get("VLLM_PORT") == (None if settings.rollout.vllm_port is None else str(settings.rollout.vllm_port))


def test_learner_runs_its_ranks_under_torchrun(settings, rendered):
    learner = plan_placement(settings).learner
    doc = rendered[("Job", "learner-searchr1-3b-grpo")]  # the Job is named after the run
    c = _container(doc)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == len(learner.gpus) == 4
    assert c["command"] == [*learner.command_prefix, "-m", "searchr1.cli"]
    i = c["command"].index("--nproc_per_node")
    assert c["command"][i + 1] == str(len(learner.gpus))
    assert c["command"][c["command"].index("--master_port") + 1] == str(settings.learner.master_port)
    assert c["args"][0] == "train"
    env = _env(c)
    assert _placed_env(learner.env).items() <= env.items()
    assert "CUDA_VISIBLE_DEVICES" not in env
    shm = {v["name"]: v for v in doc["spec"]["template"]["spec"]["volumes"]}["shm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": LEARNER_SHM}
    assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_retriever_sits_where_the_placement_says(settings, rendered):
    placed = plan_placement(settings).retriever
    doc = rendered[("Deployment", "retriever")]
    c = _container(doc)
    scaled = rendered[("ScaledObject", "retriever")]["spec"]
    assert "replicas" not in doc["spec"] and scaled["minReplicaCount"] == scaled["maxReplicaCount"] == 1
    assert c["resources"]["limits"].get("nvidia.com/gpu", 0) == len(placed.gpus) == 1
    assert _placed_env(placed.env).items() <= _env(c).items()
    assert _env(c)["RETRIEVER_SEARCH__DEVICE"] == "cuda"
    pdb = rendered[("PodDisruptionBudget", "retriever")]["spec"]
    assert "minAvailable" not in pdb and pdb["maxUnavailable"] == 1


def test_gpus_add_up_to_the_node(settings, rendered):
    """Every GPU of the placement is asked for once: the pods fit one node of `placement.gpus` GPUs."""
    asked = 0
    for key in (("Deployment", "rollout"), ("Job", "learner-searchr1-3b-grpo"), ("Deployment", "retriever")):
        doc = rendered[key]
        gpus = _container(doc)["resources"]["limits"].get("nvidia.com/gpu", 0)
        pods = (doc["spec"]["parallelism"] if key[0] == "Job" else
                rendered[("ScaledObject", key[1])]["spec"]["maxReplicaCount"])  # at most, as KEDA scales them
        asked += gpus * pods
        if gpus:
            spec = doc["spec"]["template"]["spec"]
            assert "nodeSelector" not in spec, key  # the nvidia.com/gpu request picks GPU nodes
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    plan = plan_placement(settings)
    assert asked == sum(len(p.gpus) for p in plan.by_name().values()) == settings.gpus


def test_patch_follows_a_different_placement(tmp_path):
    """Tensor parallel 2, a CPU retriever, one learner rank, a vLLM port: the patch changes with them."""
    config = tmp_path / "run.toml"
    config.write_text('''[launcher]\nrun = "other"\n[placement]\ngpus = 8
[placement.rollout]\ngpus = [0, 1, 2, 3]\ntensor_parallel_size = 2\ngpu_memory_utilization = 0.7\nvllm_port = 31000
[placement.learner]\ngpus = [4]\nmaster_port = 29600\n[placement.retriever]\ndevice = "cpu"
[learner.model]\npath = "models/Qwen2.5-3B"\n''')
    plan = deploy_plan(config)
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(k8s_placement_patch(plan)) if d}
    rollout = docs[("Deployment", "rollout")]
    assert "replicas" not in rollout["spec"] and "2 vLLM worker(s)" in k8s_placement_patch(plan)
    c = _container(rollout)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert _env(c) == {"ROLLOUT_ENGINE__TENSOR_PARALLEL_SIZE": "2", "ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION": "0.7",
                       "VLLM_PORT": "31000"}
    learner = docs[("Job", "learner-k8s")]  # the base's name: the overlay's run renames it after its patches
    lc = _container(learner)
    assert lc["command"] == ["python", "-m", "searchr1.learner.torchrun", "--nnodes", "1", "--nproc_per_node", "1",
                             "--master_addr", "127.0.0.1", "--master_port", "29600", "-m", "searchr1.cli"]
    assert "volumes" not in learner["spec"]["template"]["spec"] and "volumeMounts" not in lc
    # one rank: the learner defaults' step (8 groups × 5 × 8,192 tokens, policy 6 N + reference 2 N FLOPs per
    # token, N = 3,085,938,688) on one GPU at 100 TFLOP/s: 80.9 s
    assert _env(lc)["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(plan.grace.total_s)
    assert plan.grace.step_s == pytest.approx(8 * 5 * 8192 * 8 * 3_085_938_688 / 100e12)
    assert learner["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == plan.grace.total_s + 30
    retriever = docs[("Deployment", "retriever")]
    rc = _container(retriever)
    assert "resources" not in rc and "tolerations" not in retriever["spec"]["template"]["spec"]
    assert _env(rc) == {"RETRIEVER_SEARCH__DEVICE": "cpu", "RETRIEVER_SEARCH__FAISS_GPU": "false"}
    assert "CUDA_VISIBLE_DEVICES" not in _env(rc)


def test_the_learner_stops_within_its_grace(rendered):
    """The pod waits for torchrun, which waits the learner's grace for its ranks (a step, its checkpoint and
    snapshot at the config's shape: `searchr1.learner.stop_budget`)."""
    plan = deploy_plan(ROOT / CONFIG)
    doc = rendered[("Job", "learner-searchr1-3b-grpo")]
    assert _env(_container(doc))["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(plan.grace.total_s)
    assert doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == plan.grace.total_s + 30
