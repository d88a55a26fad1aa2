"""A real Docker daemon for the deploy test, with no container registry: start `dockerd` (or use one
that answers), build a Debian bookworm base image with mmdebstrap from the mirror apt uses, build the
searchr1 image on it, and Prometheus and Alertmanager images from the host's binaries (Debian's
`prometheus`, `prometheus-alertmanager`).

Everything here is a subprocess call; failures raise with the command's output.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

BASE_IMAGE = "searchr1-base:bookworm-minbase"
IMAGE = "searchr1:cpu"
PROMETHEUS_IMAGE = "searchr1-test-prometheus:latest"
ALERTMANAGER_IMAGE = "searchr1-test-alertmanager:latest"
BASE_PACKAGES = "python3,python3-venv,ca-certificates,redis-server,wget"
"""On top of minbase (apt included, like the slim images): Python 3.11, and Redis and wget for the
Redis and Prometheus containers."""
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").is_file() else (shutil.which("docker") or "docker")
"""The CLI of Debian's docker.io (its built-in BuildKit needs no buildx plugin), else the one on PATH."""


def run(argv: list[str], *, env: dict | None = None, timeout: float = 1800, cwd: Path | None = None,
        log: Path | None = None) -> str:
    """Run a command; return stdout+stderr; raise with its tail when it fails."""
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    out = done.stdout + done.stderr
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ {' '.join(argv)}\n{out}\n")
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{out[-6000:]}")
    return out


def missing_tools() -> list[str]:
    return [t for t in ("dockerd", "docker", "docker-compose", "mmdebstrap", "prometheus", "prometheus-alertmanager")
            if shutil.which(t) is None]


@contextmanager
def docker_daemon(workdir: Path):
    """Yield an environment whose DOCKER_HOST answers. Starts dockerd under `workdir` unless a daemon
    already answers on the default socket; on exit that daemon is stopped and its data root (images,
    build cache, volumes: ~9 GB after one deploy test) removed, keeping only `workdir/dockerd.log`."""
    env = dict(os.environ)
    if subprocess.run([DOCKER, "info"], capture_output=True, check=False).returncode == 0:
        yield env
        return
    sock = workdir / "docker.sock"
    log = (workdir / "dockerd.log").open("w")
    proc = subprocess.Popen(["dockerd", "--data-root", str(workdir / "root"), "--exec-root", str(workdir / "exec"),
                             "-H", f"unix://{sock}", "--pidfile", str(workdir / "docker.pid")],
                            stdout=log, stderr=subprocess.STDOUT)
    env["DOCKER_HOST"] = f"unix://{sock}"
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([DOCKER, "info"], env=env, capture_output=True, check=False).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: {(workdir / 'dockerd.log').read_text()[-3000:]}")
            time.sleep(1)
        yield env
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        for state in ("root", "exec"):
            shutil.rmtree(workdir / state, ignore_errors=True)
        left = [str(workdir / s) for s in ("root", "exec") if (workdir / s).exists()]
        if left:
            print(f"docker state not removed (a mount still busy?): {left}", file=sys.stderr)


def debian_mirror() -> str:
    """The Debian mirror apt uses (deb822 sources or sources.list)."""
    texts = [p.read_text() for p in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]
             if p.is_file() and (p.suffix in (".list", ".sources") or p.name == "sources.list")]
    for text in texts:
        m = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s",
                                                                           text, re.M)
        if m:
            return m.group(1)
    return "http://deb.debian.org/debian"


def image_exists(env: dict, image: str) -> bool:
    return subprocess.run([DOCKER, "image", "inspect", image], env=env, capture_output=True,
                          check=False).returncode == 0


def build_base(env: dict, log: Path) -> None:
    """Debian bookworm (Python 3.11, apt) as an image, without a registry."""
    if image_exists(env, BASE_IMAGE):
        return
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        run(["mmdebstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(tar),
             debian_mirror()], log=log, timeout=900)
        run([DOCKER, "import", "-c", "ENV LANG=C.UTF-8", str(tar), BASE_IMAGE], env=env, log=log)


def build_image(env: dict, root: Path, log: Path) -> None:
    """The searchr1 image from the repository's Dockerfile on the local base. torch's CPU wheel is carried
    into deploy/wheels/ when pip finds it locally; the host's CA bundle is a build secret."""
    wheels = root / "deploy" / "wheels"
    found = subprocess.run([sys.executable, "-m", "pip", "download", "--no-index", "--no-deps", "-q", "-d", str(wheels),
                            "torch==2.13.0+cpu"], capture_output=True, check=False)
    del found  # without it, the Dockerfile falls back to PyTorch's CPU index
    argv = [DOCKER, "build", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "-t", IMAGE]
    if CA_BUNDLE.is_file():
        argv += ["--secret", f"id=cacert,src={CA_BUNDLE}"]
    run([*argv, str(root)], env={**env, "DOCKER_BUILDKIT": "1"}, log=log, timeout=3600)


def build_prometheus(env: dict, log: Path) -> None:
    """Prometheus from the host's binary (Debian's `prometheus`, linked against libc only)."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy2(shutil.which("prometheus"), Path(tmp) / "prometheus")
        (Path(tmp) / "Dockerfile").write_text(
            f"FROM {BASE_IMAGE}\nCOPY prometheus /bin/prometheus\nRUN mkdir -p /prometheus\n"
            'ENTRYPOINT ["/bin/prometheus"]\n')
        run([DOCKER, "build", "-t", PROMETHEUS_IMAGE, tmp], env={**env, "DOCKER_BUILDKIT": "1"}, log=log)


def build_alertmanager(env: dict, log: Path) -> None:
    """Alertmanager from the host's binary (Debian's `prometheus-alertmanager`, a static Go binary) and the
    notification templates Debian's build reads from /usr/share/prometheus/alertmanager."""
    templates = Path("/usr/share/prometheus/alertmanager")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy2(shutil.which("prometheus-alertmanager"), Path(tmp) / "alertmanager")
        if templates.is_dir():
            shutil.copytree(templates, Path(tmp) / "templates")
        else:
            (Path(tmp) / "templates").mkdir()
        (Path(tmp) / "Dockerfile").write_text(
            f"FROM {BASE_IMAGE}\nCOPY alertmanager /bin/alertmanager\nCOPY templates {templates}\n"
            'RUN mkdir -p /alertmanager\nENTRYPOINT ["/bin/alertmanager"]\n')
        run([DOCKER, "build", "-t", ALERTMANAGER_IMAGE, tmp], env={**env, "DOCKER_BUILDKIT": "1"}, log=log)
