"""Every install route resolves: pip's dry run of the GPU image's requirements (`all,vllm`, faiss-gpu in place
of faiss-cpu for FAISS=gpu) under the route's constraints file, for the image's platform (CPython 3.11,
glibc 2.36: Debian bookworm, the python:3.11-slim base), binary wheels only, against the registries the
route names (PyPI, and PyTorch's CUDA 12.9 index for `cu129`). A pin with no wheel there, or a graph that
does not hold together, fails the test with pip's message naming the package. Metadata only: nothing is
downloaded beyond it, nothing installed.

A route whose registry is not reachable from here is skipped, naming it (docs/deploy.md's fact table says
where each of its wheels is published). `cu129` is also resolved from PyPI alone, PyPI's torch 2.10.0 family
(the same releases, built for CUDA 12.8) standing in for the +cu129 builds: every other pin, and that no
CUDA 13 package enters the CUDA 12 route.

Marked `deploy` (make test-deploy): it needs the registries, and each resolution takes a minute.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
PYPI = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
PLATFORM = [a for y in range(36, 16, -1) for a in ("--platform", f"manylinux_2_{y}_x86_64")] + [
    "--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
    "--only-binary=:all:"]
"""The image's platform: CPython 3.11 on glibc 2.36 (pip does not widen a manylinux tag by itself)."""
ROUTES = {"cu130": ("cu130", "cpu"), "cu129": ("cu129", "cpu"), "cu129-faiss-gpu": ("cu129", "gpu")}


def _scripts():
    sys.path.insert(0, str(ROOT / "deploy/scripts"))
    import cuda_variant
    import requirements

    return cuda_variant, requirements


def _requirements(variant: str, faiss: str, tmp_path: Path) -> Path:
    import tomllib

    cuda_variant, requirements = _scripts()
    reqs = requirements.requirements(tomllib.loads((ROOT / "pyproject.toml").read_text()), ["all", "vllm"])
    path = tmp_path / f"requirements-{variant}-{faiss}.txt"
    path.write_text("".join(r + "\n" for r in cuda_variant.faiss_inputs(variant, faiss, reqs)))
    return path


def _indexes(constraints: Path) -> list[str]:
    return [PYPI, *re.findall(r"^--extra-index-url\s+(\S+)", constraints.read_text(), re.M)]


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/", timeout=20):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (urllib.error.URLError, OSError):
        return False


def _resolve(constraints: Path, requirements: Path, report: Path) -> dict[str, dict]:
    """{name: install entry} of pip's dry run; fails with pip's output when it cannot resolve."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_NO_INDEX")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's find-links and local indexes are not the registries
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--disable-pip-version-check", "--index-url", PYPI, *PLATFORM, "--report", str(report),
            "-c", str(constraints), "-r", str(requirements)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, f"{constraints.name}: pip could not resolve it:\n{done.stdout}\n{done.stderr}"
    entries = json.loads(report.read_text())["install"]
    return {e["metadata"]["name"].lower().replace("_", "-"): e for e in entries}


def _pins(constraints: Path) -> dict[str, str]:
    lines = [line for line in constraints.read_text().splitlines() if line and not line.startswith(("#", "--"))]
    return dict(line.split("==") for line in lines)


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_the_route_resolves_to_wheels(name, tmp_path):
    variant, faiss = ROUTES[name]
    cuda_variant, _ = _scripts()
    constraints = ROOT / cuda_variant.route(variant)
    unreachable = [url for url in _indexes(constraints) if not _reachable(url)]
    if unreachable:
        pytest.skip(f"{', '.join(unreachable)} not reachable from here: route {name} not resolved "
                    "(docs/deploy.md's fact table says where its wheels are published)")
    installs = _resolve(constraints, _requirements(variant, faiss, tmp_path), tmp_path / "report.json")
    for package, version in _pins(constraints).items():
        if package == "faiss-gpu" and faiss != "gpu":
            continue
        assert installs[package]["metadata"]["version"] == version, (package, installs[package]["metadata"]["version"])
    assert all(e["download_info"]["url"].endswith(".whl") for e in installs.values())
    assert ("faiss-gpu" in installs) == (faiss == "gpu") and ("faiss-cpu" in installs) == (faiss == "cpu")
    # one CUDA runtime per route (vLLM 0.32's cutlass-dsl brings its CUDA 12 libraries too, unused there)
    other = {"cu130": ("nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12"),
             "cu129": ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-nccl-cu13")}[variant]
    assert not [p for p in installs if p in other], sorted(installs)


def test_the_cuda12_route_holds_together_from_pypi_alone(tmp_path):
    """cu129 with PyPI's torch 2.10.0 family (CUDA 12.8 builds of the same releases) in place of the +cu129
    wheels of PyTorch's index: every other pin has a wheel, and nothing needs CUDA 13."""
    if not _reachable(PYPI):
        pytest.skip(f"{PYPI} is not reachable from here")
    text = (ROOT / "deploy/constraints-cu129.txt").read_text()
    standin = tmp_path / "constraints-cu129-pypi.txt"
    standin.write_text("".join(line.split("+")[0] + "\n" for line in text.splitlines()
                               if line and not line.startswith("--extra-index-url")))
    installs = _resolve(standin, _requirements("cu129", "gpu", tmp_path), tmp_path / "report.json")
    assert installs["vllm"]["metadata"]["version"] == "0.19.1" and installs["torch"]["metadata"]["version"] == "2.10.0"
    assert installs["faiss-gpu"]["metadata"]["version"] == "1.15.1"
    assert not [p for p in installs if p.endswith("-cu13") or p == "cuda-toolkit"], sorted(installs)
    assert any(p.endswith("-cu12") for p in installs)
