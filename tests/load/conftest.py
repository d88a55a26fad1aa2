"""Load tests run only when asked for (`-m load`, `make test-load`): minutes of saturated CPU."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "load" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="load: run with -m load (make test-load)")
    for item in items:
        if "load" in item.keywords:
            item.add_marker(skip)
