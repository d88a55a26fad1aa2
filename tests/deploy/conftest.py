"""tests/deploy runs only when asked for (`-m deploy`, `make test-deploy`): it starts a Docker daemon,
builds images and runs the whole tiny world in containers, which takes many minutes and needs root."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "deploy" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="deploy: run with -m deploy (make test-deploy)")
    for item in items:
        if "deploy" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def docker_session(tmp_path_factory: pytest.TempPathFactory):
    """One Docker daemon for every deploy test of the run, with the Debian base and the searchr1 CPU image
    built once: yields the environment whose DOCKER_HOST answers. On exit the daemon's data root goes
    (tests/deploy/docker_env.py); its log is kept beside the tests' temporary directories."""
    import secrets
    import shutil
    from pathlib import Path

    from tests.deploy import docker_env as dk

    missing = dk.missing_tools()
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (Debian: docker.io docker-compose mmdebstrap prometheus)")
    keep = tmp_path_factory.mktemp("docker")
    workdir = Path("/tmp") / f"searchr1deploy{secrets.token_hex(3)}-docker"  # short: socket path length limit
    workdir.mkdir()
    try:
        with dk.docker_daemon(workdir) as env:
            dk.build_base(env, keep / "build.log")
            dk.build_image(env, Path(__file__).resolve().parents[2], keep / "build.log")
            yield env
    finally:
        if (workdir / "dockerd.log").exists():
            shutil.move(workdir / "dockerd.log", keep / "dockerd.log")
        shutil.rmtree(workdir, ignore_errors=True)
