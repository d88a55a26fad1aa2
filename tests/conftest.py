"""Shared fixtures. Markers follow the directory (tests/unit → unit, …); a real Redis server is started
once per session on a free loopback port when a test asks for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(_TESTS.resolve())
        kind = rel.parts[0]
        if kind in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, kind))
    # slow and release runs only when asked for with -m slow / -m release (make test-release)
    markexpr = config.getoption("-m") or ""
    for marker, how in (("slow", "run with -m slow"), ("release", "run with -m release (make test-release)")):
        if marker in markexpr:
            continue
        skip = pytest.mark.skip(reason=f"{marker}: {how}")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A real redis-server on a free loopback port for the whole session."""
    from searchr1.core.redis_server import RedisServer

    with RedisServer(workdir=tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
async def redis(redis_server):
    """An asyncio client on a flushed database."""
    from searchr1.streams import connect

    client = connect(redis_server.url)
    await client.flushdb()
    yield client
    await client.aclose()


WARMSTART = _TESTS.parent / "assets" / "tiny-world" / "warmstart"
"""The committed tiny-world warm start (a real policy of the tiny world: it searches and answers)."""


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory):
    """The default tiny world (seed 0, the one the committed warm start learned) without its random model,
    and a BM25 index of its corpus: (world dir, index dir, warm-start model dir). About 8 s."""
    from searchr1.retriever.builder import build_index
    from searchr1.world.build import build_world
    from searchr1.world.settings import WorldSettings

    root = tmp_path_factory.mktemp("tiny-world")
    build_world(WorldSettings(seed=0), root / "world", with_model=False)
    build_index(root / "world" / "corpus.jsonl", root / "index", "bm25")
    return root / "world", root / "index", WARMSTART
