"""docker-compose.yml as a GPU user and a first-time user meet it: every GPU service on explicit GPUs
(and the generated docker-compose.gpu.yml placing a run config's workers and learner), GPU services
scraped under the names Prometheus discovers, the committed warm start shipped in the image and copied
by `init`, `.env.example` naming every variable, Alertmanager with a runbook for every alert, and
Grafana's provisioning files valid against their schemas. The docker deploy test is tests/deploy."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from searchr1.core.settings import load_settings
from searchr1.launcher.placement import PlacementSettings, plan_placement
from tests.deploy import queries

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy/scripts"))

import compose_gpu  # noqa: E402

SECRETS = {"REDIS_PASSWORD": "p", "RETRIEVER_TOKEN": "r", "REWARD_TOKEN": "w"}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _devices(service: dict) -> list[dict]:
    return service["deploy"]["resources"]["reservations"]["devices"]


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip(f"{name} is not installed")
    return found


def test_gpu_services_name_their_gpus_and_answer_to_the_cpu_names():
    services = _compose()["services"]
    ids = {}
    for name, alias in (("rollout-gpu", "rollout"), ("learner-gpu", "learner")):
        (dev,) = _devices(services[name])
        assert "count" not in dev and dev["capabilities"] == ["gpu"], name  # count: 1 is always GPU 0
        (ids[name],) = dev["device_ids"]
        assert services[name]["networks"]["default"]["aliases"] == [alias], name
    assert ids == {"rollout-gpu": "${ROLLOUT_GPU:-0}", "learner-gpu": "${LEARNER_GPU:-1}"}


@pytest.fixture(scope="module")
def generated() -> tuple[PlacementSettings, dict]:
    from searchr1.learner.settings import LearnerSettings

    config = Path("configs/searchr1-3b-grpo.toml")
    settings = load_settings(PlacementSettings, ROOT / config)
    learner = load_settings(LearnerSettings, ROOT / config)
    text = compose_gpu.compose_gpu(config, settings, learner, _compose(), model_repo="Qwen/Qwen2.5-3B")
    return settings, yaml.safe_load(text), text


def test_generated_project_gives_each_process_its_gpus(generated):
    settings, project, _ = generated
    plan = plan_placement(settings)
    services = project["services"]
    assert {*(f"rollout-gpu-{i}" for i in range(len(plan.rollout))), "learner-gpus", "retriever", "data"} <= set(services)
    seen: list[str] = []
    for i, worker in enumerate(plan.rollout):
        s = services[f"rollout-gpu-{i}"]
        (dev,) = _devices(s)
        assert dev["device_ids"] == [str(g) for g in worker.gpus]
        assert s["environment"]["ROLLOUT_ENGINE__TENSOR_PARALLEL_SIZE"] == str(settings.rollout.tensor_parallel_size)
        assert s["networks"]["default"]["aliases"] == ["rollout"] and "profiles" not in s
        seen += dev["device_ids"]
    learner = services["learner-gpus"]
    (dev,) = _devices(learner)
    assert dev["device_ids"] == [str(g) for g in settings.learner.gpus]
    assert learner["entrypoint"] == [*plan.learner.command_prefix, "-m", "searchr1.cli"]
    assert learner["command"][0] == "train" and learner["shm_size"] == "8gb"
    assert learner["environment"]["LEARNER_DEVICE"] == "cuda"
    seen += dev["device_ids"]
    (dev,) = _devices(services["retriever"])
    assert dev["device_ids"] == [str(settings.retriever.gpu)]
    assert services["retriever"]["environment"]["RETRIEVER_SEARCH__DEVICE"] == "cuda"
    seen += dev["device_ids"]
    assert len(seen) == len(set(seen)) == settings.gpus  # no GPU twice, none idle in the 3B placement


def test_generated_project_runs_the_config_after_its_data_step_with_one_learner(generated):
    _, project, text = generated
    services = project["services"]
    searchr1 = {n: s for n, s in services.items() if s["image"] == "${SEARCHR1_GPU_IMAGE:-searchr1:gpu}"}
    assert set(searchr1) == {"data", "retriever", "reward", "learner-gpus", *(n for n in services if "rollout" in n)}
    for name, s in searchr1.items():
        assert "./configs/searchr1-3b-grpo.toml:/app/configs/run.toml:ro" in s["volumes"], name
        assert {"inputs:/app/data", "models:/app/models", "cache:/app/.cache"} <= set(s["volumes"]), name
        if name != "data":
            assert "configs/run.toml" in s["command"] and "configs/compose.toml" not in s["command"], name
            assert s["depends_on"]["data"] == {"condition": "service_completed_successfully"}, name
    # under torchrun the run's name goes through the environment (`--run` is ambiguous to torchrun)
    assert "--run" not in services["learner-gpus"]["command"]
    assert services["learner-gpus"]["environment"]["LEARNER_REDIS__RUN"] == "searchr1-3b-grpo"
    rollout = services["rollout-gpu-0"]["command"]
    assert rollout[rollout.index("--run") + 1] == "searchr1-3b-grpo"
    script = services["data"]["command"][0]
    for step in ("searchr1 data fetch data/nq_hotpotqa_train", "fetch_model Qwen/Qwen2.5-3B models/Qwen2.5-3B",
                 "fetch_model intfloat/e5-base-v2 models/e5-base-v2",
                 "searchr1 index fetch --out data/wiki-18 --encoder models/e5-base-v2"):
        assert step in script, step
    assert services["data"]["restart"] == "no"
    # one learner, no CPU pair, no tiny-world init, no profile that could add one
    assert [n for n, s in services.items() if (s.get("command") or [""])[0] == "train"] == ["learner-gpus"]
    assert not {"rollout", "learner", "init", "rollout-gpu", "learner-gpu"} & set(services)
    assert not any("profiles" in s for s in services.values())
    # the retriever's readiness budget: the config's 3,600 s floor over 64.6 GB read at 100 MB/s + 300 s
    assert services["retriever"]["healthcheck"]["start_period"] == "3600s"
    assert "GPU 7: retriever" in text and "idle" not in text


def test_readiness_budget_and_idle_gpus_by_hand(tmp_path):
    assert compose_gpu.readiness_budget_s(64_559_075_373) == 960  # 645.6 s + 300 s = 945.6 s → 16 whole minutes
    assert compose_gpu.readiness_budget_s(0) == 300 and compose_gpu.readiness_budget_s(0, floor_s=301) == 360
    assert compose_gpu.index_bytes(tmp_path / "missing", "flat") == 21_015_324 * 768 * 4 + 45
    (tmp_path / "ix").mkdir()
    (tmp_path / "ix" / "a").write_bytes(b"x" * 10)
    assert compose_gpu.index_bytes(tmp_path / "ix", "flat") == 10


def test_generated_project_validates_as_compose_v1_and_the_spec(generated, tmp_path):
    _, project, _ = generated
    path = tmp_path / "docker-compose.gpu.yml"
    path.write_text(yaml.safe_dump(project))
    done = subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    env = tmp_path / "env"
    env.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()))
    done = subprocess.run([_tool("docker-compose"), "--env-file", str(env), "--project-directory", str(ROOT),
                           "-f", str(path), "config"], capture_output=True, text=True, timeout=120, check=False,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    merged = yaml.safe_load(done.stdout)["services"]
    assert merged["rollout-gpu-1"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["1"]
    assert "--maxmemory 4096mb" in merged["redis"]["entrypoint"][2]


def test_compose_v1_reads_the_gpu_profile(tmp_path):
    env = tmp_path / "env"
    env.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()) + "ROLLOUT_GPU=2\nLEARNER_GPU=3\n")
    done = subprocess.run([_tool("docker-compose"), "--env-file", str(env), "-f", str(ROOT / "docker-compose.yml"),
                           "--profile", "gpu", "config"], capture_output=True, text=True, timeout=120, check=False,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert _devices(services["rollout-gpu"])[0]["device_ids"] == ["2"]
    assert _devices(services["learner-gpu"])[0]["device_ids"] == ["3"]


def test_env_example_names_every_variable_and_env_is_ignored():
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    example = {line.split("=", 1)[0] for line in (ROOT / ".env.example").read_text().splitlines()
               if line and not line.startswith("#")}
    assert used == example, f"missing: {used - example}; unused: {example - used}"
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()
    for key in SECRETS:  # secrets are left empty in the example
        assert f"\n{key}=\n" in (ROOT / ".env.example").read_text()


def test_first_run_copies_the_committed_warm_start():
    warm = ROOT / "assets/tiny-world/warmstart"
    assert list(warm.glob("*.safetensors"))
    assert "!assets/" in (ROOT / ".dockerignore").read_text().splitlines()
    assert re.search(r"^COPY assets \./assets$", (ROOT / "Dockerfile").read_text(), re.M)
    init = _compose()["services"]["init"]
    script = init["command"][0]
    assert "cp -r assets/tiny-world/warmstart runs/world/warmstart" in script
    assert init["environment"]["WARMSTART"] == "${SEARCHR1_WARMSTART:-assets}"
    # the world `init` builds is the one the warm start was made for (seed 0: its known entities)
    assert '"world_seed": 0' in (warm / "warmstart.json").read_text()


def test_alertmanager_is_in_compose_and_every_alert_has_a_runbook(tmp_path):
    services = _compose()["services"]
    am = services["alertmanager"]
    assert any(p.startswith("127.0.0.1:") for p in am["ports"])
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    (target,) = prom["alerting"]["alertmanagers"]
    assert target["dns_sd_configs"][0]["names"] == ["alertmanager"]
    # every alert's runbook link resolves to its heading: tests/unit/test_deploy_k8s_overlays.py
    assert prom["global"]["external_labels"]["runbook_base"].startswith("https://")
    amtool = shutil.which("amtool")
    if amtool:
        done = subprocess.run([amtool, "check-config", str(ROOT / "deploy/alertmanager/alertmanager.yml")],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("schema,path", [
    ("grafana-datasources", "deploy/grafana/provisioning/datasources/prometheus.yml"),
    ("grafana-dashboards", "deploy/grafana/provisioning/dashboards/searchr1.yml"),
    ("grafana-dashboard", "deploy/grafana/dashboards/searchr1.json"),
])
def test_grafana_files_validate_against_their_schema(schema, path):
    done = subprocess.run([_tool("check-jsonschema"), "--schemafile",
                           str(ROOT / f"tests/unit/schemas/{schema}.schema.json"), str(ROOT / path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_panels_use_the_provisioned_datasource():
    (ds,) = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"]
    import json

    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/searchr1.json").read_text())
    for panel in dashboard["panels"]:
        if "datasource" in panel:
            assert panel["datasource"]["uid"] == ds["uid"], panel["title"]


def test_queries_read_every_panel_and_alert(tmp_path):
    panels = queries.dashboard_panels(ROOT / "deploy/grafana/dashboards/searchr1.json")
    assert len(panels) >= 15 and all(panels.values())
    alerts = queries.alert_expressions(ROOT / "deploy/prometheus/rules/searchr1.yml")
    assert "TargetDown" in alerts and "LearnerStalled" in alerts
    nested = tmp_path / "d.json"
    nested.write_text('{"panels": [{"type": "row", "title": "r", "panels": [{"title": "inner", "targets": '
                      '[{"expr": "up"}, {"expr": "x"}]}]}, {"title": "text"}]}')
    assert queries.dashboard_panels(nested) == {"inner": ["up", "x"]}
    assert queries.dashboard_panels(nested, frozenset({"r"})) == {}
    flat = tmp_path / "f.json"
    flat.write_text('{"panels": [{"type": "row", "title": "a"}, {"title": "p1", "targets": [{"expr": "up"}]}, '
                    '{"type": "row", "title": "web"}, {"title": "p2", "targets": [{"expr": "w"}]}, '
                    '{"type": "row", "title": "c"}, {"title": "p3", "targets": [{"expr": "z"}]}]}')
    assert queries.dashboard_panels(flat, frozenset({"web"})) == {"p1": ["up"], "p3": ["z"]}
    from tests.deploy.test_compose_up import OPTIONAL_ROWS
    rows = {p["title"] for p in json.loads((ROOT / "deploy/grafana/dashboards/searchr1.json").read_text())["panels"]
            if p.get("type") == "row"}
    assert OPTIONAL_ROWS <= rows, "the deploy test skips rows the dashboard has"
    assert queries.empty_panels({"a": ["up", "x"], "b": ["y"]}, {"up": 0, "x": 2, "y": 0}) == ["b"]
