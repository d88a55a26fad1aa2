"""The tiny world's documented `docker compose down -v` beside a generated GPU project deletes none of the
GPU project's volumes, on a real Docker daemon with CPU stand-ins.

From the repository root, as the docs run them: docker-compose.yml (its project named after the
directory) and the 3B config's project from `searchr1 deploy compose --compose-v1` (device reservations
removed; Debian's docker-compose v1.29 reads no top-level `name:`, so the project gets the generated
name through `-p`, which is what Compose v2 takes from the file). Both are created (`up --no-start` of
Redis: its containers, network and every volume), a marker is written into the GPU project's `data`
volume (where checkpoints and snapshots live), the tiny world is taken down with `-v`, and the GPU
project's volumes, marker and container must still be there. The control: the same GPU file run under
the tiny world's project name (what a file without a name of its own got) loses its `data` volume to
the same command.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy import docker_env as dk

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/searchr1-3b-grpo.toml"


def _gpu_file(tmp_path: Path) -> tuple[Path, str]:
    """(the GPU project without its device reservations, its name from the generated header)."""
    from searchr1.deploy.plan import deploy_plan

    out = dk.run([sys.executable, "-m", "searchr1.cli", "deploy", "compose", CONFIG, "--compose-v1"], cwd=ROOT)
    spec = yaml.safe_load(out)
    for service in spec["services"].values():
        service.pop("deploy", None)  # no GPUs here
    path = tmp_path / "docker-compose.gpu.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    name = deploy_plan(ROOT / CONFIG).project
    assert f"docker-compose -p {name} " in out  # the header's commands name it
    return path, name


def _volumes(env: dict, project: str) -> set[str]:
    out = dk.run([dk.DOCKER, "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}"], env=env)
    return set(out.split())


def _write_marker(env: dict, volume: str) -> None:
    dk.run([dk.DOCKER, "run", "--rm", "-v", f"{volume}:/v", dk.BASE_IMAGE, "sh", "-c", "echo checkpoint > /v/marker"],
           env=env)


def _has_marker(env: dict, volume: str) -> bool:
    out = dk.run([dk.DOCKER, "run", "--rm", "-v", f"{volume}:/v", dk.BASE_IMAGE, "cat", "/v/marker"], env=env)
    return "checkpoint" in out


def test_down_v_of_the_tiny_world_leaves_the_gpu_project_alone(tmp_path, docker_session):
    log = tmp_path / "deploy.log"
    env = {**docker_session, "REDIS_PASSWORD": secrets.token_hex(16), "RETRIEVER_TOKEN": secrets.token_hex(16),
           "REWARD_TOKEN": secrets.token_hex(16), "REDIS_IMAGE": dk.BASE_IMAGE, "SEARCHR1_GPU_IMAGE": dk.IMAGE,
           "SEARCHR1_IMAGE": dk.IMAGE}
    gpu_file, gpu_name = _gpu_file(tmp_path)
    tiny = ["docker-compose", "--project-directory", str(ROOT), "-f", str(ROOT / "docker-compose.yml")]
    tiny_name = ROOT.name  # the directory's name: docker-compose.yml names no project
    gpu = ["docker-compose", "--project-directory", str(ROOT), "-p", gpu_name, "-f", str(gpu_file)]
    shared = ["docker-compose", "--project-directory", str(ROOT), "-p", tiny_name, "-f", str(gpu_file)]
    try:
        # the control: the GPU file under the tiny world's name shares its `data` volume, and loses it
        dk.run([*tiny, "up", "--no-start", "--no-build", "redis"], env=env, log=log, cwd=ROOT)
        dk.run([*shared, "up", "--no-start", "--no-build", "redis"], env=env, log=log, cwd=ROOT)
        _write_marker(env, f"{tiny_name}_data")
        dk.run([*tiny, "down", "-v"], env=env, log=log, cwd=ROOT)
        assert f"{tiny_name}_data" not in _volumes(env, tiny_name), "the control kept its volume"
        dk.run([*shared, "down", "-v", "--remove-orphans"], env=env, log=log, cwd=ROOT)

        # the GPU project under its own name beside the tiny world
        dk.run([*tiny, "up", "--no-start", "--no-build", "redis"], env=env, log=log, cwd=ROOT)
        dk.run([*gpu, "up", "--no-start", "--no-build", "redis"], env=env, log=log, cwd=ROOT)
        before = _volumes(env, gpu_name)
        assert before == {f"{gpu_name}_{v}" for v in yaml.safe_load(gpu_file.read_text())["volumes"]}, before
        assert not before & _volumes(env, tiny_name)
        _write_marker(env, f"{gpu_name}_data")
        dk.run([*tiny, "down", "-v"], env=env, log=log, cwd=ROOT)
        assert not _volumes(env, tiny_name)  # the tiny world's own volumes are gone
        assert _volumes(env, gpu_name) == before and _has_marker(env, f"{gpu_name}_data")
        containers = dk.run([dk.DOCKER, "ps", "-a", "--format", "{{json .Labels}}", "--filter",
                             f"label=com.docker.compose.project={gpu_name}"], env=env).split("\n")
        assert any("com.docker.compose.service=redis" in line for line in containers if line), containers
        print(f"isolation: {len(before)} volumes of {gpu_name} kept beside `down -v` of {tiny_name}; "
              f"{json.dumps(sorted(before))}")
    finally:
        for argv in (gpu, shared, tiny):
            dk.run([*argv, "down", "-v", "--remove-orphans"], env=env, log=log, cwd=ROOT, timeout=300)
