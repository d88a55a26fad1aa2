"""Kubernetes runs that complete: the learner is a Job, the rollout workers scale to zero on the tasks
stream when it ends (KEDA) or run under the HPA component instead; the gpu overlay runs the 3B config
on the fetched e5 index; storage classes default to the cluster's and are one line to change; a
monitoring namespace may scrape. Strict schema validation of the overlays is test_deploy.py's."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from searchr1.streams import TASKS_GROUP, StreamKeys
from tests.support import kustomize
from tests.support.kustomize import K8S, K8S_VERSIONS, OVERLAYS, ROOT

_container, _env, _learner = kustomize.container, kustomize.env, kustomize.learner
_overlay, _render = kustomize.overlay, kustomize.render


@pytest.mark.parametrize("overlay", ["cpu", "gpu", "gpu-7b", "gpu-7b-2node"])
def test_learner_is_a_job_that_completes(overlay):
    docs = _overlay(overlay)
    assert not [k for k in docs if k[0] == "StatefulSet"]
    learner = _learner(docs)
    job = learner["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] >= 1
    assert job["backoffLimit"] >= 1
    pod = job["template"]["spec"]
    # exit 0 at total_steps completes it; a crash or a SIGTERM before it (exit 143) fails the pod and the
    # Job starts another, which resumes; evictions and preemptions do not count against backoffLimit
    assert pod["restartPolicy"] == "Never"
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} \
        in job["podFailurePolicy"]["rules"]
    assert job["template"]["metadata"]["labels"]["app"] == "learner"  # its Service and policies select it
    assert _container(learner)["args"][0] == "train"


def _relabel_keeps(rules: list[dict], labels: dict[str, str]) -> bool:
    """Prometheus' keep/drop relabelling of one target (the only actions that decide whether it is scraped)."""
    for rule in rules:
        if rule.get("action") not in ("keep", "drop"):
            continue
        value = ";".join(labels.get(name, "") for name in rule["source_labels"])
        matched = re.fullmatch(rule["regex"], value) is not None
        if matched != (rule["action"] == "keep"):
            return False
    return True


def test_prometheus_scrapes_only_running_pods_and_learner_node_0():
    """TargetDown stays quiet for pods that serve no /metrics: finished (the learner Job at total_steps),
    Pending (waiting in an init container for the data Job); and the learner's nodes other than 0, whose
    metrics port serves their health but none of the learner's figures, are no targets either."""
    config = yaml.safe_load((K8S / "base/prometheus-k8s.yml").read_text())
    (job,) = config["scrape_configs"]
    rules = job["relabel_configs"]
    pod = {"__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true", "__meta_kubernetes_pod_label_app": "rollout",
           "__meta_kubernetes_pod_phase": "Running", "__meta_kubernetes_pod_container_init": "false"}
    assert _relabel_keeps(rules, pod)
    for phase in ("Pending", "Succeeded", "Failed", "Unknown"):
        assert not _relabel_keeps(rules, {**pod, "__meta_kubernetes_pod_phase": phase}), phase
    assert not _relabel_keeps(rules, {**pod, "__meta_kubernetes_pod_container_init": "true"})
    index = "__meta_kubernetes_pod_annotation_batch_kubernetes_io_job_completion_index"
    learner = {**pod, "__meta_kubernetes_pod_label_app": "learner"}
    assert _relabel_keeps(rules, {**learner, index: "0"}) and _relabel_keeps(rules, learner)
    assert not _relabel_keeps(rules, {**learner, index: "1"}) and not _relabel_keeps(rules, {**learner, index: "12"})
    assert _relabel_keeps(rules, {**pod, index: "1"})  # only the learner's nodes other than 0 are dropped


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_rollout_scales_on_the_tasks_stream_down_to_zero(overlay):
    docs = _overlay(overlay)
    scaled = docs[("ScaledObject", "rollout")]["spec"]
    assert scaled["scaleTargetRef"]["name"] == "rollout" and scaled["minReplicaCount"] == 0
    rollout = _container(docs[("Deployment", "rollout")])
    assert rollout["args"][rollout["args"].index("--run") + 1] == "$(SEARCHR1_RUN)"
    run = _env(rollout, "SEARCHR1_RUN")
    kinds = set()
    for trigger in scaled["triggers"]:
        meta = trigger["metadata"]
        assert trigger["type"] == "redis-streams"
        assert meta["stream"] == StreamKeys(run).tasks and meta["consumerGroup"] == TASKS_GROUP
        assert meta["address"].startswith("redis.") and meta["address"].endswith(":6379")
        auth = docs[("TriggerAuthentication", trigger["authenticationRef"]["name"])]["spec"]
        assert auth["secretTargetRef"] == [{"parameter": "password", "name": "searchr1-secrets",
                                            "key": "redis-password"}]
        kinds |= {k for k in ("lagCount", "pendingEntriesCount") if k in meta}
    assert kinds == {"lagCount", "pendingEntriesCount"}  # backlog scales out; work in flight keeps one
    assert ("HorizontalPodAutoscaler", "rollout") not in docs


def _with_hpa(name: str, on_top: bool, tmp_path) -> dict:
    """The overlay with `components: [../../components/hpa]` added to its own kustomization.yaml, or to a
    user's overlay on top of it (docs/deploy.md names both)."""
    shutil.copytree(K8S, tmp_path / "k8s")
    if on_top:
        mine = tmp_path / "k8s/overlays/mine"
        mine.mkdir()
        (mine / "kustomization.yaml").write_text(
            f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../{name}]\n"
            "components: [../../components/hpa]\n")
        return _render(mine)
    path = tmp_path / "k8s/overlays" / name / "kustomization.yaml"
    text = path.read_text()
    if "\ncomponents: [" in text:  # the gpu overlays name components/gpu-node already
        text = text.replace("\ncomponents: [", "\ncomponents: [../../components/hpa, ", 1)
    else:
        text += "components: [../../components/hpa]\n"
    path.write_text(text)
    return _render(path.parent)


@pytest.mark.parametrize("on_top", [False, True], ids=["in-the-overlay", "on-top"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_component_replaces_keda_with_the_overlays_ceiling(overlay, on_top, tmp_path):
    """Either way the HPA replaces both ScaledObjects (their patches in the overlay are targeted, so they
    skip instead of failing the render), scales up to the ceiling the overlay gives the rollout
    ScaledObject (the gpu overlays': the placement's three GPU workers), and validates."""
    docs = _with_hpa(overlay, on_top, tmp_path)
    hpa = docs[("HorizontalPodAutoscaler", "rollout")]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "rollout"
    assert not [k for k in docs if k[0] in ("ScaledObject", "TriggerAuthentication")]
    keda = _overlay(overlay)
    assert hpa["maxReplicas"] == keda[("ScaledObject", "rollout")]["spec"]["maxReplicaCount"]
    if overlay != "cpu":  # the placement's three GPU workers; the Deployment names no count (KEDA's or the HPA's)
        assert hpa["maxReplicas"] == 3 and "replicas" not in keda[("Deployment", "rollout")]["spec"]
    assert _learner(docs)["metadata"]["name"] == _learner(keda)["metadata"]["name"]
    for version in K8S_VERSIONS:
        kustomize.validate(list(docs.values()), version, tmp_path)


@pytest.mark.parametrize("overlay,klass", [("cpu", "standard"), ("gpu", "nfs-client")])
def test_storage_class_is_one_line_per_overlay(overlay, klass, tmp_path):
    """Unset: every PVC takes the cluster's default class. Uncommenting the marked line sets all of them."""
    assert all("storageClassName" not in d["spec"] for k, d in _overlay(overlay).items()
               if k[0] == "PersistentVolumeClaim")
    shutil.copytree(K8S, tmp_path / "k8s")
    path = tmp_path / "k8s/overlays" / overlay / "kustomization.yaml"
    lines = path.read_text().splitlines()
    marked = [i for i, line in enumerate(lines) if line.strip().startswith("# storage class: ")]
    assert len(marked) == 1
    lines[marked[0]] = lines[marked[0]].replace("# storage class: ", "", 1)
    path.write_text("\n".join(lines) + "\n")
    pvcs = [d for k, d in _render(path.parent).items() if k[0] == "PersistentVolumeClaim"]
    assert len(pvcs) == 2 and all(p["spec"]["storageClassName"] == klass for p in pvcs)


def test_gpu_configmap_is_the_3b_config():
    copy = K8S / "overlays/gpu/searchr1-3b-grpo.toml"
    assert copy.read_text() == (ROOT / "configs/searchr1-3b-grpo.toml").read_text(), \
        f"cp configs/searchr1-3b-grpo.toml {copy.relative_to(ROOT)}"
    (cm,) = [d for k, d in _overlay("gpu").items() if k[0] == "ConfigMap" and k[1].startswith("searchr1-config")]
    assert cm["data"] == {"compose.toml": copy.read_text()}
    docs = _overlay("gpu")
    for doc in (docs[("Deployment", "rollout")], _learner(docs), docs[("Deployment", "retriever")],
                docs[("Deployment", "reward")]):
        args = _container(doc)["args"]
        assert args[args.index("--config") + 1] == "configs/compose.toml", doc["metadata"]["name"]


def test_gpu_retriever_serves_the_fetched_e5_index():
    import tomllib

    docs = _overlay("gpu")
    config = tomllib.loads((ROOT / "configs/searchr1-3b-grpo.toml").read_text())
    index = config["launcher"]["retriever"]["index_dir"]
    args = _container(docs[("Deployment", "retriever")])["args"]
    assert args[args.index("--index") + 1] == index and "--corpus" not in args
    script = _container(kustomize.data_job(docs))["args"][0]
    out = index.rsplit("/index", 1)[0]
    assert f"searchr1 index fetch --out {out} --encoder" in script
    assert "searchr1 data fetch data/nq_hotpotqa_train" in script
    assert f"--local-dir {config['learner']['model']['path']}" in script
    assert script.rstrip().endswith('touch "runs/$SEARCHR1_RUN/.data-ready"')  # what the init containers wait for
    for doc in (docs[("Deployment", "rollout")], _learner(docs), docs[("Deployment", "retriever")],
                kustomize.data_job(docs)):
        mounts = {m["mountPath"]: m for m in _container(doc)["volumeMounts"]}
        for sub in ("data", "models"):
            assert mounts[f"/app/{sub}"] == {"name": "data", "mountPath": f"/app/{sub}", "subPath": sub}, \
                doc["metadata"]["name"]


def test_monitoring_and_keda_namespaces_are_let_in():
    policies = {d["metadata"]["name"]: d for d in yaml.safe_load_all((K8S / "base/network-policies.yaml").read_text())}
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    for name in ("metrics-from-prometheus", "retriever-from-rollout", "reward-from-rollout"):
        assert any(monitoring in rule["from"] for rule in policies[name]["spec"]["ingress"]), name
    keda = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}
    assert any(keda in rule["from"] for rule in policies["redis-from-rollout-and-learner"]["spec"]["ingress"])
