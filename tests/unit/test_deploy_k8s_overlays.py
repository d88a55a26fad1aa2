"""The Kubernetes overlays deploy what they say, checked on the objects `kubectl kustomize` renders: the
image and tag every searchr1 container gets (per overlay, and in a user's overlay with its own registry);
GPU workloads never surge; the run's identity (the learner and data Jobs, its directories, its data
marker and the streams named after the run; the same run renders the same objects; a new run, a config
edit or another overlay changes no Job template, an image change for the same run does); Alertmanager wired to Prometheus; every alert's
runbook link resolving to a heading in docs; the retriever released with the workers; probes that mean
ready; disruption budgets that let a node drain; the 7B learner across two nodes (an Indexed Job,
torchrun with c10d rendezvous at node 0)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.kustomize import (
    K8S,
    OVERLAYS,
    ROOT,
    container,
    data_job,
    env,
    learner,
    overlay,
    pod_specs,
    render,
)

TAGS = {"cpu": "cpu", "gpu": "gpu", "gpu-7b": "gpu", "gpu-7b-2node": "gpu"}
THIRD_PARTY = ("docker.io/library/redis:", "docker.io/prom/prometheus:", "docker.io/prom/alertmanager:",
               "docker.io/grafana/grafana:")


def _images(docs: dict) -> dict[str, str]:
    """{workload/container: image} of every container and init container."""
    out = {}
    for doc, spec in pod_specs(docs):
        for c in spec.get("initContainers", []) + spec["containers"]:
            out[f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"] = c["image"]
    return out


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_searchr1_container_runs_the_overlays_image(name):
    images = _images(overlay(name))
    ours = {k: v for k, v in images.items() if not v.startswith(THIRD_PARTY)}
    # data, retriever, reward, rollout, learner + 3 wait-for-data (+ the 2-node learner's wait-for-node-0)
    assert len(ours) == 8 + (name == "gpu-7b-2node"), images
    assert set(ours.values()) == {f"registry.example.com/searchr1:{TAGS[name]}"}, ours


def test_a_users_overlay_sets_its_own_registry_and_tag(tmp_path):
    shutil.copytree(K8S, tmp_path / "k8s")
    mine = tmp_path / "k8s/overlays/mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../gpu]\n"
        "images:\n  - {name: registry.example.com/searchr1, newName: ghcr.io/lab/searchr1, newTag: v2-cuda13}\n")
    ours = {k: v for k, v in _images(render(mine)).items() if not v.startswith(THIRD_PARTY)}
    assert len(ours) == 8 and set(ours.values()) == {"ghcr.io/lab/searchr1:v2-cuda13"}, ours


def test_kustomize_edit_set_image_in_an_overlay_reaches_every_container(tmp_path):
    """docs/deploy.md's one command (`kustomize edit set image searchr1=…`) rewrites the overlay's entry."""
    shutil.copytree(K8S, tmp_path / "k8s")
    path = tmp_path / "k8s/overlays/cpu/kustomization.yaml"
    path.write_text(path.read_text().replace("newName: registry.example.com/searchr1\n    newTag: cpu",
                                             "newName: registry.lab:5000/searchr1\n    newTag: '0.4'"))
    ours = {k: v for k, v in _images(render(path.parent)).items() if not v.startswith(THIRD_PARTY)}
    assert set(ours.values()) == {"registry.lab:5000/searchr1:0.4"}, ours


@pytest.mark.parametrize("name", OVERLAYS)
def test_gpu_workloads_never_surge(name):
    """A rolling update on a full GPU node would wait forever for a GPU to surge onto."""
    gpu = 0
    for doc, spec in pod_specs(overlay(name)):
        if doc["kind"] != "Deployment" or not any(
                "nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in spec["containers"]):
            continue
        gpu += 1
        strategy = doc["spec"]["strategy"]
        assert strategy["type"] == "Recreate" or strategy["rollingUpdate"]["maxSurge"] == 0, doc["metadata"]["name"]
    assert gpu == (0 if name == "cpu" else 2)


RUN_FROM = {"gpu-7b-2node": "gpu-7b"}
"""An overlay whose run is named by the overlay under it."""
RUNS = {"cpu": "tiny-cpu", "gpu": "searchr1-3b-grpo", "gpu-7b": "searchr1-7b-grpo",
        "gpu-7b-2node": "searchr1-7b-grpo"}


def _run_of(docs: dict) -> str:
    return docs[("ConfigMap", "searchr1-run")]["data"]["run"]


def _check_run(docs: dict, run: str) -> None:
    assert _run_of(docs) == run
    job = learner(docs)
    assert job["metadata"]["name"] == f"learner-{run}"
    c = container(job)
    assert env(c, "SEARCHR1_RUN") == run and env(c, "LEARNER_REDIS__RUN") == "$(SEARCHR1_RUN)"
    for var in ("LEARNER_CHECKPOINT__DIR", "LEARNER_WEIGHTS__DIR", "LEARNER_LOG_DIR"):
        assert env(c, var).startswith("runs/$(SEARCHR1_RUN)/"), var  # each run its own directories
    assert env(container(docs[("Deployment", "rollout")]), "SEARCHR1_RUN") == run
    data = data_job(docs)  # the run's data, marked ready for the run's pods alone
    assert data["metadata"]["name"] == f"searchr1-data-{run}" and env(container(data), "SEARCHR1_RUN") == run
    assert container(data)["args"][0].rstrip().endswith('touch "runs/$SEARCHR1_RUN/.data-ready"')
    for doc, spec in pod_specs(docs):
        for c in spec.get("initContainers", []):
            if c["name"] == "wait-for-data":
                assert '[ -f "/app/runs/$SEARCHR1_RUN/.data-ready" ]' in c["command"][-1], doc["metadata"]["name"]
                (var,) = c["env"]  # read when the pod starts: the retriever's template names no run
                assert var == {"name": "SEARCHR1_RUN",
                               "valueFrom": {"configMapKeyRef": {"name": "searchr1-run", "key": "run"}}}
    for key, doc in docs.items():
        if key[0] == "ScaledObject":
            assert {t["metadata"]["stream"] for t in doc["spec"]["triggers"]} == {f"searchr1:{run}:tasks"}, key


def _job_updates(before: dict, after: dict) -> list[str]:
    """Jobs `kubectl apply` of `after` over `before` would change in place: a Job's pod template is
    immutable, so each of these fails the apply."""
    return sorted(k[1] for k, d in after.items() if k[0] == "Job" and k in before
                  and before[k]["spec"]["template"] != d["spec"]["template"])


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_run_names_the_job_its_directories_and_streams(name):
    _check_run(overlay(name), RUNS[name])


@pytest.mark.parametrize("name", OVERLAYS)
def test_a_new_run_gets_a_new_job_and_the_same_run_renders_the_same(name, tmp_path):
    shutil.copytree(K8S, tmp_path / "k8s")
    path = tmp_path / "k8s/overlays" / RUN_FROM.get(name, name) / "kustomization.yaml"
    text = path.read_text()
    assert text.count(f"literals: [run={RUNS[name]}]") == 1  # the run is one line
    path.write_text(text.replace(f"literals: [run={RUNS[name]}]", "literals: [run=ablation-2]"))
    second = render(tmp_path / "k8s/overlays" / name)
    _check_run(second, "ablation-2")
    assert _job_updates(overlay(name), second) == []  # applied over the first run: new Jobs only
    assert second == render(tmp_path / "k8s/overlays" / name)  # `kubectl apply -k` again: nothing changes
    # a config edit changes the ConfigMap in place, never a Job template (immutable) or a name
    (tmp_path / "k8s/base/compose.toml").write_text((tmp_path / "k8s/base/compose.toml").read_text() + "\n# edit\n")
    edited = render(tmp_path / "k8s/overlays" / name)
    assert learner(edited) == learner(second) and set(edited) == set(second)
    assert _job_updates(second, edited) == []
    for _, spec in pod_specs(edited):
        for volume in spec.get("volumes", []):
            if "configMap" in volume and volume["configMap"]["name"].startswith("searchr1-"):
                assert volume["configMap"]["name"] in ("searchr1-config", "searchr1-run"), volume


def test_switching_overlays_in_one_namespace_creates_new_jobs():
    """gpu -> gpu-7b (another run, another model to fetch) applies: both Jobs are the new run's."""
    assert _job_updates(overlay("gpu"), overlay("gpu-7b")) == []
    assert _job_updates(overlay("cpu"), overlay("gpu")) == []


def test_an_image_change_for_the_same_run_meets_the_immutable_job_templates(tmp_path):
    """What docs/deploy.md ("A new image for the same run") has the user do: delete the run's two Jobs
    before applying; Deployments roll over by themselves."""
    shutil.copytree(K8S, tmp_path / "k8s")
    mine = tmp_path / "k8s/overlays/mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../gpu]\n"
        "images:\n  - {name: registry.example.com/searchr1, newTag: gpu-2}\n")
    run = RUNS["gpu"]
    assert _job_updates(overlay("gpu"), render(mine)) == [f"learner-{run}", f"searchr1-data-{run}"]


def test_alertmanager_receives_prometheus_alerts():
    docs = overlay("cpu")
    am = docs[("Deployment", "alertmanager")]
    args = container(am)["args"]
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in args
    assert docs[("Service", "alertmanager")]["spec"]["ports"][0]["port"] == 9093
    config = yaml.safe_load((K8S / "base/prometheus-k8s.yml").read_text())
    (target,) = [t for a in config["alerting"]["alertmanagers"] for s in a["static_configs"] for t in s["targets"]]
    assert target == "alertmanager:9093"
    policy = docs[("NetworkPolicy", "alertmanager-from-prometheus")]["spec"]
    assert policy["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]
    (cm,) = [d for k, d in docs.items() if k[0] == "ConfigMap" and k[1].startswith("alertmanager-config")]
    assert cm["data"]["alertmanager.yml"] == (ROOT / "deploy/alertmanager/alertmanager.yml").read_text()


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("config", ["deploy/prometheus/prometheus.yml", "deploy/k8s/base/prometheus-k8s.yml"])
def test_every_alert_links_its_runbook_heading(config):
    """Each rule's runbook_url, rendered with the config's `runbook_base`, is an absolute link to a file in
    docs/ and one of its headings; every alert is documented there."""
    base = yaml.safe_load((ROOT / config).read_text())["global"]["external_labels"]["runbook_base"]
    assert base.startswith("https://") and base.endswith("/docs")
    rules = [r for g in yaml.safe_load((ROOT / "deploy/prometheus/rules/searchr1.yml").read_text())["groups"]
             for r in g["rules"] if "alert" in r]
    assert len(rules) >= 21
    for rule in rules:
        url = rule["annotations"]["runbook_url"].replace("{{ $externalLabels.runbook_base }}", base)
        assert url.startswith(base + "/"), (rule["alert"], url)
        path, anchor = url[len(base) + 1:].split("#")
        doc = ROOT / "docs" / path
        headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", doc.read_text(), re.M)}
        assert anchor == _slug(rule["alert"]) and anchor in headings, (rule["alert"], url)


def test_the_retriever_is_released_with_the_workers():
    """KEDA scales the retriever to zero on the same drained tasks stream as the rollout workers (after the
    learner Job completes), and runs one replica while the run has tasks."""
    for name in OVERLAYS:
        docs = overlay(name)
        scaled, rollout = docs[("ScaledObject", "retriever")]["spec"], docs[("ScaledObject", "rollout")]["spec"]
        assert scaled["scaleTargetRef"]["name"] == "retriever" and scaled["idleReplicaCount"] == 0
        assert scaled["minReplicaCount"] == scaled["maxReplicaCount"] == 1
        assert "replicas" not in docs[("Deployment", "retriever")]["spec"]  # KEDA's count, not the manifest's
        assert [t["metadata"]["stream"] for t in scaled["triggers"]] == [t["metadata"]["stream"] for t in rollout["triggers"]]
        # active while any task waits or is in flight: KEDA's redis-streams scaler compares each trigger's
        # count (lag, pending entries) with activationLagCount
        assert [t["metadata"]["activationLagCount"] for t in scaled["triggers"]] == ["0", "0"]
        assert {k for t in scaled["triggers"] for k in t["metadata"]} >= {"lagCount", "pendingEntriesCount"}


@pytest.mark.parametrize("name", OVERLAYS)
def test_rollout_is_ready_only_once_vllm_has_loaded(name):
    """/readyz is 503 until the engine is loaded (tests/integration/test_rollout_readiness.py); /metrics
    answers while it loads, so it cannot be the startup probe."""
    c = container(overlay(name)[("Deployment", "rollout")])
    assert c["startupProbe"]["httpGet"]["path"] == "/readyz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"


@pytest.mark.parametrize("name", OVERLAYS)
def test_disruption_budgets_let_a_node_drain(name):
    docs = overlay(name)
    budgets = [d for k, d in docs.items() if k[0] == "PodDisruptionBudget"]
    assert len(budgets) == 3
    for pdb in budgets:
        app = pdb["spec"]["selector"]["matchLabels"]["app"]
        deployment = docs[("Deployment", app)]["spec"]  # KEDA sets the workers' and retriever's count
        scaled = docs.get(("ScaledObject", app))
        replicas = deployment.get("replicas") or (scaled["spec"]["maxReplicaCount"] if scaled else 1)
        spec = pdb["spec"]
        allowed = spec["maxUnavailable"] if "maxUnavailable" in spec else replicas - spec["minAvailable"]
        assert allowed >= 1, (name, app, spec, replicas)


def test_the_7b_learner_runs_across_nodes():
    docs = overlay("gpu-7b-2node")
    job = learner(docs)
    spec, c = job["spec"], container(job)
    nodes = int(env(c, "TORCHRUN_NNODES"))
    assert nodes == 2 and spec["completions"] == spec["parallelism"] == nodes and spec["completionMode"] == "Indexed"
    cmd = c["command"]

    def opt(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert cmd[:3] == ["python", "-m", "searchr1.learner.torchrun"] and opt("--nnodes") == "$(TORCHRUN_NNODES)"
    assert opt("--rdzv-backend") == "c10d"
    assert opt("--nproc_per_node") == "4" and c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert opt("--rdzv-id") == "$(SEARCHR1_RUN)" and int(opt("--max-restarts")) >= 1
    assert cmd[-2:] == ["-m", "searchr1.cli"] and c["args"][0] == "train"
    run = env(c, "SEARCHR1_RUN")
    subdomain = job["spec"]["template"]["spec"]["subdomain"]
    # pod i is `<job>-i.<subdomain>`: the endpoint names pod 0, and each node's --local-addr is its own name
    # (torchrun orders node ranks by it, so global rank 0, the one on Redis, is on pod 0)
    assert opt("--rdzv-endpoint").replace("$(SEARCHR1_RUN)", run) == f"{job['metadata']['name']}-0.{subdomain}:29400"
    assert opt("--local-addr").replace("$(SEARCHR1_RUN)", run) == f"{job['metadata']['name']}-$(NODE_INDEX).{subdomain}"
    (index,) = [e for e in c["env"] if e["name"] == "NODE_INDEX"]
    assert index["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env(c, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1"  # a replaced node can rejoin
    service = docs[("Service", subdomain)]["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    assert service["selector"] == {"app": "learner"}
    assert docs[("Service", "learner")]["spec"]["selector"]["batch.kubernetes.io/job-completion-index"] == "0"
    # every node serves /healthz (node 0: rank 0's progress; another node: its own ranks'), so one liveness
    # probe fits every pod; patient enough for a torchrun restart round, in which no rank serves: the
    # rendezvous (up to join_timeout) and then loading the model and checkpoint (5 min allowed)
    conf = dict(kv.split("=") for kv in opt("--rdzv-conf").split(","))
    join = int(conf["join_timeout"])
    # node 0's store is waited for as long as a round (torch's 60 s default fails a node whose peer's pod
    # starts later, against the Job's backoffLimit), and nodes other than 0 start once it answers
    assert int(conf["read_timeout"]) >= join
    (wait,) = [i for i in job["spec"]["template"]["spec"]["initContainers"] if i["name"] == "wait-for-node-0"]
    assert "29400" in wait["command"][-1] and 'os.environ["NODE_INDEX"] != "0"' in wait["command"][-1]
    assert env(c, "NCCL_IB_DISABLE") == "1"  # no RDMA under Pod Security "restricted": TCP sockets, said
    live, start = c["livenessProbe"], c["startupProbe"]
    for probe in (live, start):
        assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert probe["periodSeconds"] * probe["failureThreshold"] >= join + 300, probe
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"containerPort": 9404, "name": "metrics"} in c["ports"]
    peers = docs[("NetworkPolicy", "learner-from-learner")]["spec"]
    assert peers["podSelector"] == {"matchLabels": {"app": "learner"}}
    assert peers["ingress"] == [{"from": [{"podSelector": {"matchLabels": {"app": "learner"}}}]}]


def test_the_7b_overlay_runs_the_7b_config():
    copy = K8S / "overlays/gpu-7b/searchr1-7b-grpo.toml"
    assert copy.read_text() == (ROOT / "configs/searchr1-7b-grpo.toml").read_text(), \
        f"cp configs/searchr1-7b-grpo.toml {copy.relative_to(ROOT)}"
    docs = overlay("gpu-7b")
    assert docs[("ConfigMap", "searchr1-config")]["data"] == {"compose.toml": copy.read_text()}
    script = container(data_job(docs))["args"][0]
    assert "hf download Qwen/Qwen2.5-7B --local-dir models/Qwen2.5-7B" in script and "2.5-3B" not in script


def test_amtool_accepts_the_k8s_alertmanager_config(tmp_path):
    amtool = shutil.which("amtool") or shutil.which("amtool", path=str(Path(sys.executable).parent))
    if not amtool:
        pytest.skip("amtool is not installed (Debian package prometheus-alertmanager)")
    (cm,) = [d for k, d in overlay("gpu").items() if k[0] == "ConfigMap" and k[1].startswith("alertmanager-config")]
    (tmp_path / "alertmanager.yml").write_text(cm["data"]["alertmanager.yml"])
    done = subprocess.run([amtool, "check-config", str(tmp_path / "alertmanager.yml")], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
