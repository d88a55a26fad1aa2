"""CPU cores as devices: `[placement]` cores planned like GPUs (every process has some, none twice, all of
them exist), the thread settings that follow, the affinity `searchr1 up` applies to a real child, and the
compose `cpuset` / Kubernetes whole-CPU resources the generators write from the same placement."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from searchr1.core.settings import load_settings
from searchr1.deploy.compose import ComposeOptions, compose_project
from searchr1.deploy.k8s import k8s_placement_patch
from searchr1.deploy.plan import deploy_plan
from searchr1.launcher.cpu_placement import (
    CorePlacementError,
    core_list,
    parse_cores,
    placement_cpu_resources,
    plan_cores,
)
from searchr1.launcher.placement import (
    PlacementError,
    PlacementSettings,
    placement_conflicts,
    plan_placement,
)
from searchr1.launcher.planner import build_plan
from searchr1.launcher.processes import child_preexec
from searchr1.launcher.settings import LauncherSettings
from searchr1.launcher.specs import dry_run_lines

ROOT = Path(__file__).resolve().parents[2]
SMALL_WITH_ROLLOUT = {"retriever": {"cores_with": "rollout"}, "reward": {"cores_with": "rollout"},
                      "redis": {"cores_with": "rollout"}}


def test_core_lists_read_and_written():
    assert parse_cores("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cores([5, 2]) == [5, 2] and parse_cores("") == []
    assert core_list([8, 0, 1, 2, 3, 11, 10]) == "0-3,8,10-11" and core_list([4]) == "4"
    with pytest.raises(ValueError, match="runs backwards"):
        parse_cores("3-1")
    with pytest.raises(ValueError, match="cannot read 'x'"):
        parse_cores("0,x")


def test_two_cores_disaggregated_small_services_beside_rollout():
    shares = plan_cores({"rollout": [0], "learner": [1]}, {"retriever": "rollout", "reward": "rollout",
                                                            "redis": "rollout"}, 1, {0, 1}, colocate=False)
    assert {n: (s.cores, s.with_role) for n, s in shares.items()} == {
        "rollout-0": ((0,), None), "learner": ((1,), None), "retriever": ((0,), "rollout"),
        "reward": ((0,), "rollout"), "redis": ((0,), "rollout")}


def test_sixteen_cores_two_workers_cut_in_order():
    shares = plan_cores({"rollout": list(range(8)), "learner": list(range(8, 14)), "retriever": [14],
                         "reward": [15], "redis": []}, {"redis": "learner"}, 2, range(16), colocate=False)
    assert shares["rollout-0"].cpuset == "0-3" and shares["rollout-1"].cpuset == "4-7"
    assert shares["learner"].count == 6 and shares["redis"].cpuset == "8-13"
    assert shares["retriever"].cores == (14,) and shares["reward"].with_role is None


def test_colocated_every_process_on_every_core():
    shares = plan_cores({"rollout": [0, 1], "learner": [0, 1], "retriever": [0, 1], "reward": [0, 1],
                         "redis": [0, 1]}, {}, 1, {0, 1}, colocate=True)
    assert {s.cpuset for s in shares.values()} == {"0-1"}


@pytest.mark.parametrize(("own", "shared", "workers", "message"), [
    ({"rollout": [0, 1], "learner": [1]}, SMALL_WITH_ROLLOUT, 1, "core 1 is given to both rollout and learner"),
    ({"rollout": [0], "learner": [1, 2]}, SMALL_WITH_ROLLOUT, 1, r"learner cores \[2\] do not exist here"),
    ({"rollout": [0], "learner": [1, 1]}, SMALL_WITH_ROLLOUT, 1, r"learner lists cores \[1\] more than once"),
    ({"rollout": [0], "learner": []}, SMALL_WITH_ROLLOUT, 1, "learner has no cores"),
    ({"rollout": [0], "learner": [1]}, {"retriever": "rollout", "reward": "rollout"}, 1, "redis has no cores"),
    ({"rollout": [0], "learner": [1], "redis": [0]}, {"redis": "rollout", "retriever": "rollout",
                                                    "reward": "rollout"}, 1, "redis has both cores"),
    ({"rollout": [0], "learner": [1]}, SMALL_WITH_ROLLOUT, 2, "1 rollout cores cannot be cut into 2"),
])
def test_impossible_core_placements_are_named(own, shared, workers, message):
    shared = {k: v["cores_with"] if isinstance(v, dict) else v for k, v in shared.items()}
    with pytest.raises(CorePlacementError, match=message):
        plan_cores(own, shared, workers, {0, 1}, colocate=False)


def test_cpu_only_placement_sets_the_threads_each_process_gets():
    s = PlacementSettings(cpus=4, rollout={"cores": "0-1", "workers": 2}, learner={"cores": [2, 3]},
                          **SMALL_WITH_ROLLOUT)
    p = plan_placement(s)
    assert not p.places_gpus and p.places_cores
    assert [(w.name, w.env) for w in p.rollout] == [("rollout-0", {"VLLM_CPU_OMP_THREADS_BIND": "0"}),
                                                   ("rollout-1", {"VLLM_CPU_OMP_THREADS_BIND": "1"})]
    assert p.learner.env == {"LEARNER_THREADS": "2"} and p.learner.command_prefix == ()
    assert p.retriever.env == {"RETRIEVER_BATCH_THREADS": "2"}
    assert set(p.by_name()) == {"rollout-0", "rollout-1", "learner", "retriever", "reward", "redis"}
    assert placement_cpu_resources(p)["learner"] == {"cpuset": "2-3", "cpus": 2}
    with pytest.raises(PlacementError, match="places nothing"):
        plan_placement(PlacementSettings())
    with pytest.raises(PlacementError, match=r"cores \[4\] do not exist"):
        plan_placement(PlacementSettings(rollout={"cores": [4]}, learner={"cores": [1]}, **SMALL_WITH_ROLLOUT),
                       cores_here={0, 1, 2, 3})


def test_gpus_and_cores_learner_threads_per_rank():
    s = PlacementSettings(gpus=4, cpus=32, rollout={"gpus": [0, 1], "cores": "0-15"},
                          learner={"gpus": [2, 3], "cores": "16-27"}, retriever={"cores": "28-31"},
                          reward={"cores_with": "rollout"}, redis={"cores_with": "learner"})
    p = plan_placement(s)
    assert [w.cores.cpuset for w in p.rollout] == ["0-7", "8-15"]
    assert p.learner.env["LEARNER_THREADS"] == "6" and p.learner.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    with pytest.raises(PlacementError, match="rollout.workers = 3 but rollout.gpus make 2"):
        plan_placement(s.model_copy(update={"rollout": s.rollout.model_copy(update={"workers": 3})}))


def test_config_values_the_cores_decide_are_refused():
    p = plan_placement(PlacementSettings(cpus=2, rollout={"cores": [0]}, learner={"cores": [1]},
                                         **SMALL_WITH_ROLLOUT))
    conflicts = placement_conflicts({"learner": {"threads": 2}, "retriever": {"faiss_threads": 4,
                                                                              "torch_threads": 1}}, p)
    assert any("[learner] threads = 2 but the placement sets it to 1" in c for c in conflicts)
    assert any("[retriever] faiss_threads = 4 but [placement] gives retriever 1 core(s)" in c for c in conflicts)
    assert placement_conflicts({"learner": {"threads": 1}, "retriever": {"torch_threads": 1}}, p) == []


def test_up_plans_cores_and_shows_them(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text("""
[launcher]
run = "cores"
[launcher.retriever]
corpus = "corpus.jsonl"
[placement]
cpus = 2
[placement.rollout]
cores = [0]
[placement.learner]
cores = [1]
[placement.retriever]
cores_with = "rollout"
[placement.reward]
cores_with = "rollout"
[placement.redis]
cores_with = "rollout"
[learner]
threads = 2
""")
    plan = build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run")
    cores = {s.name: s.cores for s in plan.specs}
    assert cores["learner"] == (1,) and cores["rollout-0"] == (0,) and cores["redis"] == (0,)
    assert cores.get("index-build", ()) == ()
    lines = dry_run_lines(plan)
    assert "learner (learner, GPUs: all, cores: 1)" in lines
    assert "cores: rollout-0 0 | learner 1 | retriever 0 (with rollout) | reward 0 (with rollout) | redis 0 " \
           "(with rollout)" in lines
    assert any("[learner] threads = 2" in p for p in plan.problems)
    learner = next(s for s in plan.specs if s.name == "learner")
    assert learner.argv[1:3] == ["-m", "searchr1.cli"] and learner.env["LEARNER_THREADS"] == "1"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_a_started_process_runs_on_its_cores_only():
    core = max(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                         preexec_fn=child_preexec(False, (core,)), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"[{core}]"
    assert child_preexec(False, ()) is None


def _cored_config(tmp_path: Path, redis_with: str = "learner") -> Path:
    """configs/searchr1-3b-grpo.toml with 64 cores placed: rollout 0-23, learner 24-47, retriever 48-63,
    the reward service on the rollout's, Redis on `redis_with`'s."""
    text = (ROOT / "configs/searchr1-3b-grpo.toml").read_text()
    for table, cores in (("[placement]\n", "cpus = 64\n"), ("[placement.rollout]\n", 'cores = "0-23"\n'),
                         ("[placement.learner]\n", 'cores = "24-47"\n'), ("[placement.retriever]\n", 'cores = "48-63"\n')):
        assert table in text
        text = text.replace(table, table + cores, 1)
    config = tmp_path / "run.toml"
    config.write_text(text + f'\n[placement.reward]\ncores_with = "rollout"\n[placement.redis]\ncores_with = "{redis_with}"\n')
    return config


def test_k8s_patch_pins_whole_cpus_requests_equal_limits(tmp_path):
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(k8s_placement_patch(deploy_plan(_cored_config(tmp_path))))}
    rollout = docs["rollout"]["spec"]["template"]["spec"]
    res = rollout["containers"][0]["resources"]
    assert res == {"requests": {"cpu": "8", "memory": None}, "limits": {"nvidia.com/gpu": 1, "cpu": "8"}}
    assert not any(e["name"] == "VLLM_CPU_OMP_THREADS_BIND" for e in rollout["containers"][0]["env"])
    assert rollout["initContainers"][0]["resources"]["limits"] == {"cpu": "10m"}
    learner = docs["learner-k8s"]["spec"]["template"]["spec"]["containers"][0]
    assert learner["resources"]["limits"] == {"nvidia.com/gpu": 4, "cpu": "24"}
    assert {"name": "LEARNER_THREADS", "value": "6"} in learner["env"]
    assert docs["redis"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "24"


def test_compose_project_gives_each_placed_service_its_cpuset(tmp_path):
    project = yaml.safe_load(compose_project(deploy_plan(_cored_config(tmp_path)),
                                             yaml.safe_load((ROOT / "docker-compose.yml").read_text()),
                                             ComposeOptions(model_repo="Qwen/Qwen2.5-3B")))
    cpusets = {name: s.get("cpuset") for name, s in project["services"].items()}
    assert cpusets["rollout-gpu-0"] == "0-7" and cpusets["rollout-gpu-2"] == "16-23"
    assert cpusets["learner-gpus"] == "24-47" and cpusets["retriever"] == "48-63"
    assert cpusets["reward"] == "0-23" and cpusets["redis"] == "24-47" and cpusets["prometheus"] is None


def test_up_refuses_cores_this_machine_does_not_have(tmp_path):
    far = 4095
    cfg = tmp_path / "run.toml"
    cfg.write_text(f"""
[launcher.retriever]
corpus = "corpus.jsonl"
[placement]
cpus = 4096
cpu_colocate = true
[placement.rollout]
cores = [{far}]
[placement.learner]
cores = [{far}]
[placement.retriever]
cores_with = "rollout"
[placement.reward]
cores_with = "rollout"
[placement.redis]
cores_with = "rollout"
""")
    plan = build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run")
    assert any(f"gives it cores [{far}], which this machine does not let the launcher use" in p for p in plan.problems)


def test_k8s_patch_renders_guaranteed_pods_through_kustomize(tmp_path):
    import shutil

    from tests.support.kustomize import tool

    kubectl = tool("kubectl")
    k8s = tmp_path / "k8s"
    shutil.copytree(ROOT / "deploy" / "k8s", k8s)
    (k8s / "overlays" / "gpu" / "placement.yaml").write_text(k8s_placement_patch(deploy_plan(_cored_config(tmp_path))))
    out = subprocess.run([kubectl, "kustomize", str(k8s / "overlays" / "gpu")], capture_output=True, text=True,
                         check=True).stdout
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in yaml.safe_load_all(out)
            if d and d["kind"] in ("Deployment", "Job")}
    learner = next(v for k, v in pods.items() if k.startswith("learner-"))
    for pod in (pods["rollout"], learner, pods["retriever"], pods["reward"], pods["redis"]):
        for c in [*pod["containers"], *pod.get("initContainers", [])]:
            req, lim = c["resources"].get("requests", {}), c["resources"]["limits"]
            assert req["cpu"] == lim["cpu"], c["name"]  # CPU requests = limits
            assert "memory" not in req and "memory" in lim, c["name"]  # the request defaults to the limit
    assert pods["rollout"]["containers"][0]["resources"]["limits"]["cpu"] == "8"
