"""Rendering the Kubernetes overlays as a cluster operator would (`kubectl kustomize`), and reading the
rendered objects: `overlay("gpu")` is {(kind, name): object}, rendered once per test session."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
OVERLAYS = ("cpu", "gpu", "gpu-7b")


def kubectl() -> str:
    found = shutil.which("kubectl") or shutil.which("kubectl", path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip("kubectl is not installed (dev extra)")
    return found


def render(path: Path) -> dict[tuple[str, str], dict]:
    done = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=300,
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


def pod_specs(docs: dict[tuple[str, str], dict]) -> list[tuple[dict, dict]]:
    """(object, pod spec) of every workload."""
    return [(d, d["spec"]["template"]["spec"]) for d in docs.values() if d.get("spec", {}).get("template")]
