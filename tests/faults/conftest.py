"""tests/faults: the cases marked `faults` run only when asked for (`-m faults`, `make test-faults`); the one
unmarked case runs with the default suite. The tiny world is built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "faults" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="faults: run with -m faults (make test-faults)")
    for item in items:
        if item.get_closest_marker("faults") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fault_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.faults.harness import build_world

    return build_world(tmp_path_factory.mktemp("fault-world") / "world")
