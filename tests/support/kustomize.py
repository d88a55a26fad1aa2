"""Rendering the Kubernetes overlays as a cluster operator would (`kubectl kustomize`), reading the
rendered objects (`overlay("gpu")` is {(kind, name): object}, rendered once per test session) and
validating them strictly against the Kubernetes schemas `kubernetes-validate` bundles: those of the
oldest Kubernetes the overlays support (docs/deploy.md, "Kubernetes versions") and of the newest it knows."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
OVERLAYS = ("cpu", "gpu", "gpu-7b", "gpu-7b-2node")
OLDEST_K8S = "1.28"
"""The oldest Kubernetes the overlays run on: the learner Service selects the pods' completion-index label
(1.28); the Job's pod failure policy and the DisruptionTarget condition are on by default from 1.26."""
K8S_VERSIONS = (OLDEST_K8S, None)
"""What the schema tests validate against: the oldest supported, and (None) kubernetes-validate's default,
the newest Kubernetes whose schemas it bundles."""


def tool(name: str) -> str:
    """An external validator on PATH or next to this interpreter (the dev extra's venv); skips without it."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip(f"{name} is not installed (dev extra)")
    return found


def validate(docs: list[dict], version: str | None, tmp_path: Path) -> None:
    """`kubernetes-validate --strict` of the rendered objects against Kubernetes `version`'s schemas (None:
    the newest it bundles). Kinds it has no schema for (KEDA's) are warned about, not failed: their own
    schema checks them (test_deploy_keda.py)."""
    path = tmp_path / f"rendered-{version or 'newest'}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    argv = [tool("kubernetes-validate"), "--strict", "--quiet", *(["-k", version] if version else []), str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"


def render(path: Path) -> dict[tuple[str, str], dict]:
    done = subprocess.run([tool("kubectl"), "kustomize", str(path)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}


_CACHE: dict[str, dict] = {}


def overlay(name: str) -> dict[tuple[str, str], dict]:
    if name not in _CACHE:
        _CACHE[name] = render(K8S / "overlays" / name)
    return _CACHE[name]


def container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def env(c: dict, name: str) -> str:
    (value,) = [e["value"] for e in c.get("env", []) if e["name"] == name]
    return value


def learner(docs: dict[tuple[str, str], dict]) -> dict:
    """The learner Job (named after the run, so found by its label)."""
    (job,) = [d for (kind, _), d in docs.items()
              if kind == "Job" and d["metadata"].get("labels", {}).get("app") == "learner"]
    return job


def data_job(docs: dict[tuple[str, str], dict]) -> dict:
    """The run's data Job (`searchr1-data-<run>`, found by its label)."""
    (job,) = [d for (kind, _), d in docs.items()
              if kind == "Job" and d["metadata"].get("labels", {}).get("app") == "searchr1-data"]
    return job


def pod_specs(docs: dict[tuple[str, str], dict]) -> list[tuple[dict, dict]]:
    """(object, pod spec) of every workload."""
    return [(d, d["spec"]["template"]["spec"]) for d in docs.values() if d.get("spec", {}).get("template")]
