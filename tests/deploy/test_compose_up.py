"""`docker compose up` of the whole tiny world on a real Docker daemon: Redis, the init service (world
and index built, the warm start copied from the image), retriever, reward, two rollout workers, the
learner, Prometheus and Alertmanager, from an image built on a locally built base. Passes when training
reaches N steps, both workers generate with a newer policy version, Prometheus scrapes every target `up`
and reaches Alertmanager, every Grafana panel's PromQL returns a series and every alert expression
evaluates; everything is torn down after (the session's Docker data root too, after the last deploy test:
tests/deploy/conftest.py).

The run config is configs/compose.toml shrunk (fewer groups per step, shorter answers) so steps are
quick on a small CPU machine; ports are published on free loopback ports.
"""

from __future__ import annotations

import json
import secrets
import socket
import time
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.deploy import docker_env as dk
from tests.deploy import queries

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(5400)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
WORKERS = 2
TARGETS = {"retriever": 1, "reward": 1, "rollout": WORKERS, "learner": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _small_config(path: Path) -> None:
    text = (ROOT / "configs/compose.toml").read_text()
    config = tomllib.loads(text)
    assert config["learner"]["batch"]["groups_per_step"] >= 2
    text = text.replace("groups_per_step = 8", "groups_per_step = 2").replace("group_size = 8", "group_size = 4")
    text = text.replace("max_tokens_per_turn = 64", "max_tokens_per_turn = 32")
    assert tomllib.loads(text)["learner"]["batch"]["groups_per_step"] == 2
    path.write_text(text)


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _values(port: int, promql: str) -> dict[str, float]:
    try:
        return {s["metric"].get("instance", ""): float(s["value"][1]) for s in _query(port, promql)}
    except OSError:
        return {}


def _check_alertmanager(port: int) -> None:
    """Prometheus found Alertmanager through compose's DNS and would send it alerts."""
    deadline = time.monotonic() + 120
    active: list = []
    while time.monotonic() < deadline and not active:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alertmanagers", timeout=10) as r:
            active = json.load(r)["data"]["activeAlertmanagers"]
        time.sleep(0 if active else 5)
    assert active, "Prometheus has no active Alertmanager"


OPTIONAL_ROWS = frozenset({"Web search backend", "Validation during training (searchr1 up)"})
"""Dashboard rows of features the tiny world's compose run does not use (a web search backend; validation,
which `searchr1 up`'s launcher runs): their panels have no series there, so they are not required to."""


def _check_dashboards_and_alerts(port: int) -> None:
    """Every Grafana panel's PromQL returns at least one series; every alert expression evaluates."""
    panels = queries.dashboard_panels(ROOT / "deploy/grafana/dashboards/searchr1.json", OPTIONAL_ROWS)
    series = {e: len(_query(port, e)) for exprs in panels.values() for e in exprs}
    empty = queries.empty_panels(panels, series)
    assert not empty, f"dashboard panels with no series after training: {empty}\n{series}"
    for expr in queries.alert_expressions(ROOT / "deploy/prometheus/rules/searchr1.yml").values():
        _query(port, expr)  # asserts status success; an alert that does not fire returns no series


def test_compose_up_trains_and_every_target_is_scraped(tmp_path, docker_session):
    log = tmp_path / "deploy.log"
    config_dir = tmp_path / "configs"
    config_dir.mkdir()
    _small_config(config_dir / "compose.toml")
    prom_port = _free_port()
    override = tmp_path / "override.yml"
    override.write_text(yaml.safe_dump({"services": {
        name: {"volumes": [f"{config_dir}:/app/configs:ro"]} for name in ("init", "retriever", "reward",
                                                                             "rollout", "learner", "learner-check")}}))
    project = f"searchr1test{secrets.token_hex(3)}"
    _deploy_and_train(docker_session, log, override, prom_port, project)


def _deploy_and_train(env: dict, log: Path, override: Path, prom_port: int, project: str) -> None:
    timings: dict[str, float] = {}
    t0 = time.monotonic()  # the base and searchr1 images come built with the session's daemon
    dk.build_prometheus(env, log)
    dk.build_alertmanager(env, log)
    timings["images"] = time.monotonic() - t0
    env = {**env, "REDIS_PASSWORD": secrets.token_hex(16), "RETRIEVER_TOKEN": secrets.token_hex(16),
           "REWARD_TOKEN": secrets.token_hex(16), "REDIS_IMAGE": dk.BASE_IMAGE,
           "PROMETHEUS_IMAGE": dk.PROMETHEUS_IMAGE, "SEARCHR1_IMAGE": dk.IMAGE,
           "ALERTMANAGER_IMAGE": dk.ALERTMANAGER_IMAGE, "REDIS_PORT": str(_free_port()),
           "RETRIEVER_PORT": str(_free_port()), "PROMETHEUS_PORT": str(prom_port),
           "ALERTMANAGER_PORT": str(_free_port())}
    compose = ["docker-compose", "-p", project, "-f", str(ROOT / "docker-compose.yml"), "-f", str(override)]
    try:
        t_up = time.monotonic()
        dk.run([*compose, "up", "-d", "--no-build", "--scale", f"rollout={WORKERS}", "redis", "init",
                "retriever", "reward", "rollout", "learner", "prometheus", "alertmanager"],
               env=env, log=log, timeout=3600)
        timings["up"] = time.monotonic() - t_up
        deadline = time.monotonic() + 3600
        steps, versions, up = {}, {}, {}
        while time.monotonic() < deadline:
            steps = _values(prom_port, "searchr1_learner_steps_total")
            if steps and max(steps.values()) >= 1 and "first_step" not in timings:
                timings["first_step"] = time.monotonic() - t_up  # `up` started -> first step scraped
            versions = _values(prom_port, "searchr1_rollout_weight_version")
            up = _values(prom_port, "up")
            if (steps and max(steps.values()) >= STEPS and len(versions) == WORKERS
                    and min(versions.values()) >= 1 and len(up) == sum(TARGETS.values())
                    and min(up.values()) == 1):
                break
            time.sleep(10)
        timings["train"] = time.monotonic() - t_up - timings["up"]
        status = dk.run([*compose, "ps"], env=env, log=log)
        assert steps and max(steps.values()) >= STEPS, f"learner steps {steps}\n{status}"
        assert len(versions) == WORKERS and min(versions.values()) >= 1, f"worker versions {versions}"
        jobs = {s["metric"]["job"]: 0 for s in _query(prom_port, "up")}
        for s in _query(prom_port, "up"):
            jobs[s["metric"]["job"]] += 1
            assert s["value"][1] == "1", f"target down: {s['metric']}"
        assert jobs == TARGETS, jobs
        rules = json.load(urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=10))
        assert sum(len(g["rules"]) for g in rules["data"]["groups"]) >= 9
        _check_alertmanager(prom_port)
        _check_dashboards_and_alerts(prom_port)
    finally:
        try:
            dk.run([*compose, "logs", "--no-color", "--tail", "200"], env=env, log=log, timeout=300)
        finally:
            dk.run([*compose, "down", "-v", "--remove-orphans", "-t", "30"], env=env, log=log, timeout=600)
            timings["total"] = time.monotonic() - t0
            print(f"deploy timings (s): { {k: round(v) for k, v in timings.items()} }; log: {log}")
