"""Kill-to-next-step under `docker compose` with the shipped defaults: the tiny world as in
test_compose_up.py (two rollout workers, configs/compose.toml shrunk the same way, lockstep). Once training
has begun, as soon as one worker holds a task (pending under its consumer name in the tasks group), its
main process (`searchr1 serve rollout`, under the container's init) is killed with SIGKILL from inside its
container; the container exits non-zero and restarts (`restart: on-failure`) under the same host name (the
consumer name is `host-pid`: the same again when the restarted process gets the same pid). The figure is
the time from the kill to the learner's next step (its step log's wall-clock `time`, read from inside the
learner's container), printed with the time the container took to start again. The task the dead worker
held does not wait out a visibility timeout of minutes: a restarted worker of the same name re-reads it at
once, else the live one reclaims it after `rollout.tasks.visibility_timeout_ms` (30 s; heartbeats keep
live workers' tasks).

Marked `slow` as well as `deploy`: `make test-deploy` leaves it out; `make bench-compose-kill` runs it.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest
import yaml

from tests.deploy import docker_env as dk
from tests.deploy.test_compose_up import ROOT, _free_port, _small_config

pytestmark = [pytest.mark.deploy, pytest.mark.slow, pytest.mark.timeout(5400)]

KILL_WHILE_HOLDING = """
import os, signal, socket, time
import redis
r = redis.Redis.from_url(os.environ["ROLLOUT_REDIS__URL"])
me = socket.gethostname() + "-"
deadline = time.time() + 900
while time.time() < deadline:
    held = [c for c in r.xpending("searchr1:compose:tasks", "rollout")["consumers"]
            if c["pending"] and c["name"].decode().startswith(me)]
    if held:
        break
    time.sleep(0.1)
else:
    raise SystemExit("this worker never held a task")
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0") + [b"", b"", b""]
    except OSError:
        continue
    if int(p) not in (1, os.getpid()) and argv[1].endswith(b"searchr1") and argv[2:4] == [b"serve", b"rollout"]:
        os.kill(int(p), signal.SIGKILL)
        print(time.time(), p, held[0]["name"].decode(), held[0]["pending"])
"""
"""Run inside a worker's container: wait until this worker holds a task (pending under its consumer name,
`host-pid`), then SIGKILL its main process (not the init, PID 1); prints the time, the pid, the consumer
and how many tasks it held."""
STEPS_LOG = "runs/compose/learner/compose.jsonl"
"""The learner's step log inside its container (configs/compose.toml `[learner] log_dir`, run `compose`)."""


def _steps(compose: list[str], env: dict) -> list[dict]:
    try:
        out = dk.run([*compose, "exec", "-T", "learner", "cat", STEPS_LOG], env=env, timeout=60)
    except RuntimeError:
        return []
    return [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"step"' in line]


def _wait_steps(compose: list[str], env: dict, predicate, timeout: float, what: str) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = _steps(compose, env)
        if predicate(steps):
            return steps
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}: {dk.run([*compose, 'ps'], env=env)}")


def test_kill_a_worker_to_the_next_step(tmp_path, docker_session):
    log = tmp_path / "deploy.log"
    config_dir = tmp_path / "configs"
    config_dir.mkdir()
    _small_config(config_dir / "compose.toml")
    override = tmp_path / "override.yml"
    override.write_text(yaml.safe_dump({"services": {
        name: {"volumes": [f"{config_dir}:/app/configs:ro"]} for name in ("init", "retriever", "reward",
                                                                             "rollout", "learner", "learner-check")}}))
    project = f"searchr1test{secrets.token_hex(3)}"
    _deploy_kill_and_measure(docker_session, log, override, project)


def _deploy_kill_and_measure(env: dict, log: Path, override: Path, project: str) -> None:
    env = {**env, "REDIS_PASSWORD": secrets.token_hex(16), "RETRIEVER_TOKEN": secrets.token_hex(16),
           "REWARD_TOKEN": secrets.token_hex(16), "REDIS_IMAGE": dk.BASE_IMAGE, "SEARCHR1_IMAGE": dk.IMAGE,
           "REDIS_PORT": str(_free_port()), "RETRIEVER_PORT": str(_free_port()),
           "PROMETHEUS_PORT": str(_free_port()), "ALERTMANAGER_PORT": str(_free_port())}
    compose = ["docker-compose", "-p", project, "-f", str(ROOT / "docker-compose.yml"), "-f", str(override)]
    try:
        dk.run([*compose, "up", "-d", "--no-build", "--scale", "rollout=2", "redis", "init", "retriever",
                "reward", "rollout", "learner"], env=env, log=log, timeout=3600)
        _wait_steps(compose, env, lambda s: len(s) >= 2, 3600, "two training steps")
        victim = dk.run([*compose, "ps", "-q", "rollout"], env=env).split()[0]
        out = dk.run([dk.DOCKER, "exec", victim, "python", "-c", KILL_WHILE_HOLDING], env=env, log=log)
        stamp, pid, consumer, held = out.split()[-4:]
        killed_at = float(stamp)
        steps = _wait_steps(compose, env, lambda s: any(r["time"] > killed_at for r in s), 1800,
                            "the next step after the kill")
        next_step = min(r["time"] for r in steps if r["time"] > killed_at) - killed_at
        deadline = time.monotonic() + 600
        while (inspect := json.loads(dk.run([dk.DOCKER, "inspect", victim], env=env))[0])["RestartCount"] < 1:
            assert time.monotonic() < deadline, inspect["State"]
            time.sleep(2)
        print(f"compose kill -9 of one rollout worker of two (its main process, pid {pid} in its "
              f"container, consumer {consumer}, holding {held} task(s)): next training step {next_step:.1f} s after the kill; the container restarted "
              f"{inspect['RestartCount']} time(s), last started {inspect['State']['StartedAt']} (killed at "
              f"{time.strftime('%H:%M:%S', time.gmtime(killed_at))} UTC); "
              f"steps before the kill {sum(r['time'] <= killed_at for r in steps)}")
    finally:
        try:
            dk.run([*compose, "logs", "--no-color", "--tail", "200"], env=env, log=log, timeout=300)
        finally:
            dk.run([*compose, "down", "-v", "--remove-orphans", "-t", "30"], env=env, log=log, timeout=600)
