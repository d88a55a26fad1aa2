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
