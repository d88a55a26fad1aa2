"""docker-compose.yml as a GPU user and a first-time user meet it: docker-compose.tiny-gpu.yml putting the
tiny world's own worker and learner on explicit GPUs (and the generated docker-compose.gpu.yml placing a
run config's workers and learner, its retriever sized for the index its data step fetches, its learner
behind the Redis budget check), the committed warm start shipped in the image and copied by `init`,
`.env.example` naming every variable, Alertmanager with a runbook for every alert, and Grafana's
provisioning files valid against their schemas. That no documented compose command starts two learners:
test_deploy_compose_one_learner.py. The docker deploy test is tests/deploy."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from searchr1.deploy import DeployError
from searchr1.deploy import compose as compose_gpu
from searchr1.deploy.plan import deploy_plan
from tests.deploy import queries

ROOT = Path(__file__).resolve().parents[2]

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


def _tiny_gpu() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.tiny-gpu.yml").read_text())


def test_tiny_gpu_override_puts_the_same_worker_and_learner_on_named_gpus():
    base, override = _compose()["services"], _tiny_gpu()["services"]
    assert set(override) == {"rollout", "learner"} <= set(base)  # overrides, adds no service
    ids = {}
    for name, service in override.items():
        (dev,) = _devices(service)
        assert "count" not in dev and dev["capabilities"] == ["gpu"], name  # count: 1 is always GPU 0
        (ids[name],) = dev["device_ids"]
        assert service["image"] == "${SEARCHR1_GPU_IMAGE:-searchr1:gpu}"
        assert service["build"]["dockerfile"] == "Dockerfile.cuda"
    assert ids == {"rollout": "${ROLLOUT_GPU:-0}", "learner": "${LEARNER_GPU:-1}"}
    assert override["learner"]["environment"]["LEARNER_DEVICE"] == "cuda"


def test_learner_waits_for_the_redis_budget_check_that_runs_once():
    services = _compose()["services"]
    check, learner = services["learner-check"], services["learner"]
    assert check["restart"] == "no" and learner["restart"] == "on-failure"
    assert check["command"] == [*learner["command"], "--check"] and check["environment"] == learner["environment"]
    assert learner["depends_on"]["learner-check"] == {"condition": "service_completed_successfully"}
    assert check["depends_on"] == {"redis": {"condition": "service_healthy"}}


@pytest.fixture(scope="module")
def generated() -> tuple:
    plan = deploy_plan(ROOT / "configs/searchr1-3b-grpo.toml", source="configs/searchr1-3b-grpo.toml")
    text = compose_gpu.compose_project(plan, _compose())
    return plan, yaml.safe_load(text), text


def test_generated_project_gives_each_process_its_gpus(generated):
    deployed, project, _ = generated
    settings, plan = deployed.settings, deployed.placed
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
    assert set(searchr1) == {"data", "retriever", "reward", "learner-gpus", "learner-check",
                             *(n for n in services if "rollout" in n)}
    for name, s in searchr1.items():
        assert "./configs/searchr1-3b-grpo.toml:/app/configs/run.toml:ro" in s["volumes"], name
        assert {"inputs:/app/data", "models:/app/models", "cache:/app/.cache"} <= set(s["volumes"]), name
        if name != "data":
            assert "configs/run.toml" in s["command"] and "configs/compose.toml" not in s["command"], name
        if name not in ("data", "learner-check"):
            assert s["depends_on"]["data"] == {"condition": "service_completed_successfully"}, name
    # the Redis budget check: the learner's own command and environment, once, before the learner, not
    # after the data step (a run Redis cannot hold is refused before the downloads)
    check, learner = services["learner-check"], services["learner-gpus"]
    assert check["command"] == [*learner["command"], "--check"] and check["environment"] == learner["environment"]
    assert check["restart"] == "no" and "deploy" not in check and check["depends_on"] == {
        "redis": {"condition": "service_healthy"}}
    assert learner["depends_on"]["learner-check"] == {"condition": "service_completed_successfully"}
    assert "VLLM_CPU_KVCACHE_SPACE" not in services["rollout-gpu-0"]["environment"]
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
    assert compose_gpu.trainers(services) == ["learner-gpus"]
    assert not {"rollout", "learner", "init"} & set(services)
    assert not any("profiles" in s for s in services.values())
    # the retriever's readiness budget: the config's 3,600 s floor over 64.6 GB read at 100 MB/s + 300 s,
    # the index the data step fetches by default
    assert services["retriever"]["healthcheck"]["start_period"] == "3600s"
    assert services["data"]["environment"]["SEARCHR1_INDEX_REPO"] == "${SEARCHR1_INDEX_REPO:-PeterJinGo/wiki-18-e5-index}"
    assert "PeterJinGo/wiki-18-e5-index: flat, 21,015,324 × 768 float32, 64,559,075,373 bytes" in text
    assert "GPU 7: retriever" in text and "idle" not in text


def test_readiness_budget_from_the_fetched_index_by_hand():
    assert compose_gpu.readiness_budget_s(64_559_075_373) == 960  # 645.6 s + 300 s = 945.6 s → 16 whole minutes
    assert compose_gpu.readiness_budget_s(0) == 300 and compose_gpu.readiness_budget_s(0, floor_s=301) == 360
    size, how = compose_gpu.index_size("PeterJinGo/wiki-18-e5-index", "flat")
    assert size == 21_015_324 * 768 * 4 + 45 and "flat" in how  # header, then 21,015,324 × 768 float32
    assert compose_gpu.index_size("me/my-index", "flat", index_bytes=10) == (10, "me/my-index: 10 bytes (--index-bytes)")
    with pytest.raises(DeployError, match="--index-bytes"):
        compose_gpu.index_size("me/my-index", "flat")
    with pytest.raises(DeployError, match="kind = 'ivfpq'"):
        compose_gpu.index_size("PeterJinGo/wiki-18-e5-index", "ivfpq")


def _generate(tmp_path, text: str, **kw) -> str:
    config = tmp_path / "run.toml"
    config.write_text(text)
    return compose_gpu.compose_project(deploy_plan(config), _compose(),
                                       compose_gpu.ComposeOptions(model_repo="Qwen/Qwen2.5-3B", **kw))


def test_generator_refuses_what_the_project_could_not_run(tmp_path):
    text = (ROOT / "configs/searchr1-3b-grpo.toml").read_text()
    # FAISS on GPU is the placement's to decide: a service table saying otherwise is refused
    faiss = text.replace('device = "cuda"                         # e5-base-v2', 'faiss_gpu = true\ndevice = "cuda" #')
    assert "faiss_gpu = true" in faiss
    with pytest.raises(DeployError, match=r"\[retriever.search\] faiss_gpu = true .* \[placement.retriever\] faiss_gpu"):
        _generate(tmp_path, faiss)
    placed = text.replace("gpu = 7\n", "gpu = 7\nfaiss_gpu = true\n", 1)
    out = _generate(tmp_path, placed)
    assert "retriever (query encoder + FAISS)" in out and "FAISS=gpu" in out
    assert "RETRIEVER_SEARCH__FAISS_GPU: 'true'" in out
    elsewhere = text.replace('index_dir = "data/wiki-18/index"', 'index_dir = "data/wiki-18/e5"')
    with pytest.raises(DeployError, match="end it in /index"):
        _generate(tmp_path, elsewhere)
    with pytest.raises(DeployError, match="--index-bytes"):
        _generate(tmp_path, text, index_repo="me/my-index")
    own = _generate(tmp_path, text, index_repo="me/my-index", index_bytes=400_000_000_000, encoder_repo="me/enc")
    assert yaml.safe_load(own)["services"]["retriever"]["healthcheck"]["start_period"] == "4320s"  # 4,000 + 300 s
    assert "${SEARCHR1_INDEX_REPO:-me/my-index}" in own and "fetch_model me/enc models/e5-base-v2" in own


def test_generated_project_validates_as_compose_v1_and_the_spec(generated, tmp_path):
    """The file as generated against the Compose spec (v2 reads its `name:`); what `--compose-v1` writes
    (no `name:`) as Debian's docker-compose v1.29 reads it, with the project named by `-p`."""
    plan, project, _ = generated
    path = tmp_path / "docker-compose.gpu.yml"
    path.write_text(yaml.safe_dump(project))
    done = subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    v1 = compose_gpu.compose_project(plan, _compose(), compose_gpu.ComposeOptions(compose_v1=True))
    assert "name" not in yaml.safe_load(v1) and f"docker-compose -p {plan.project} -f docker-compose.gpu.yml up -d" in v1
    path.write_text(v1)
    env = tmp_path / "env"
    env.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()))
    done = subprocess.run([_tool("docker-compose"), "--env-file", str(env), "--project-directory", str(ROOT),
                           "-p", plan.project, "-f", str(path), "config"], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    merged = yaml.safe_load(done.stdout)["services"]
    assert merged["rollout-gpu-1"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["1"]
    assert "--maxmemory 4096mb" in merged["redis"]["entrypoint"][2]


def test_generated_project_is_its_own_beside_the_tiny_world(generated):
    """Its own name (so its own containers, network and volumes, `<name>_data`…), never the tiny world's:
    `docker compose down -v` of docker-compose.yml, whose project is named after its directory, touches
    none of them (run on the daemon: tests/deploy/test_compose_isolation.py)."""
    plan, project, text = generated
    assert project["name"] == plan.project == "searchr1-3b-grpo"
    assert "name" not in _compose()  # the tiny world: the directory's name, or -p
    assert set(project["volumes"]) == set(compose_gpu.VOLUMES) and not any(project["volumes"].values())
    assert "up -d data " in text  # the data step alone first: `up -d` of the rest waits on it


def test_the_learner_stops_within_its_grace(generated):
    """torchrun waits the learner's grace (a step, its checkpoint and snapshot at the config's shape) for
    its ranks, and compose waits 30 s more for torchrun."""
    plan, project, text = generated
    learner = project["services"]["learner-gpus"]
    assert learner["entrypoint"][:3] == ["python", "-m", "searchr1.learner.torchrun"]
    assert learner["environment"]["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(plan.grace.total_s) == "1380"
    assert learner["stop_grace_period"] == f"{plan.grace.total_s + 30}s"
    assert plan.grace.explain() in text


def test_the_7b_run_gets_its_own_project_on_one_node():
    plan = deploy_plan(ROOT / "configs/searchr1-7b-grpo.toml", source="configs/searchr1-7b-grpo.toml")
    project = yaml.safe_load(compose_gpu.compose_project(plan, _compose()))
    services = project["services"]
    assert project["name"] == "searchr1-7b-grpo"
    gpus = sorted(int(g) for s in services.values() for d in s.get("deploy", {}).get("resources", {})
                  .get("reservations", {}).get("devices", []) for g in d["device_ids"])
    assert gpus == list(range(8))  # one 8-GPU node, every GPU once
    assert "fetch_model Qwen/Qwen2.5-7B models/Qwen2.5-7B" in services["data"]["command"][0]
    assert services["learner-gpus"]["environment"]["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(plan.grace.total_s)
    assert plan.grace.total_s > deploy_plan(ROOT / "configs/searchr1-3b-grpo.toml").grace.total_s


def test_compose_v1_reads_the_tiny_gpu_override(tmp_path):
    env = tmp_path / "env"
    env.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()) + "ROLLOUT_GPU=2\nLEARNER_GPU=3\n")
    done = subprocess.run([_tool("docker-compose"), "--env-file", str(env), "-f", str(ROOT / "docker-compose.yml"),
                           "-f", str(ROOT / "docker-compose.tiny-gpu.yml"), "config"], capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert _devices(services["rollout"])[0]["device_ids"] == ["2"]
    assert _devices(services["learner"])[0]["device_ids"] == ["3"]
    assert services["learner"]["build"]["dockerfile"] == "Dockerfile.cuda"
    assert services["learner"]["environment"]["LEARNER_REDIS__URL"].endswith("@redis:6379/0")  # merged, not replaced


def test_env_example_names_every_variable_and_env_is_ignored():
    text = (ROOT / "docker-compose.yml").read_text() + (ROOT / "docker-compose.tiny-gpu.yml").read_text()
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
