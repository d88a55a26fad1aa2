"""`searchr1 weights rollback VERSION` against a real Redis: only a version the learner announced can be
re-announced (same uri and digest), the stored fencing token is kept, and a rollout worker's loader goes
back to it; a version never announced is refused."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from searchr1.cli import build_app
from searchr1.core.schemas import WeightVersion
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.streams import StreamKeys
from searchr1.weightsync import WeightLoader, announce, announced_fence, latest, rollback, snapshot_digest


class _Engine:
    def __init__(self) -> None:
        self.reloads: list[str] = []

    async def reload(self, path: str, digest=None) -> None:
        self.reloads.append(path)


def _snapshot(root, version: int, data: bytes) -> WeightVersion:
    d = root / f"v{version:08d}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(data)
    return WeightVersion(version=version, uri=str(d), sha256=snapshot_digest(d))


async def test_rollback_re_announces_a_published_version_and_workers_go_back(redis, tmp_path):
    keys = StreamKeys("rb")
    v1, v2 = _snapshot(tmp_path / "w", 1, b"one"), _snapshot(tmp_path / "w", 2, b"two")
    await announce(redis, keys, v1, fence=7)
    await announce(redis, keys, v2, fence=7)
    engine = _Engine()
    loader = WeightLoader(redis, keys, engine, tmp_path / "dl", **RolloutMetrics().loader_callbacks())
    assert await loader.maybe_update() and loader.version == 2

    again = await rollback(redis, keys, 1)
    assert (again.version, again.uri, again.sha256) == (v1.version, v1.uri, v1.sha256)
    assert (await latest(redis, keys)).version == 1 and await announced_fence(redis, keys) == 7
    assert await loader.maybe_update() and loader.version == 1
    assert not await loader.maybe_update()  # loaded: nothing more to do
    assert len(engine.reloads) == 2


async def test_rollback_refuses_a_version_the_learner_never_announced(redis, tmp_path):
    keys = StreamKeys("rb")
    await announce(redis, keys, _snapshot(tmp_path / "w", 1, b"one"))
    with pytest.raises(LookupError, match=r"version 5 was never announced .*\[1\]"):
        await rollback(redis, keys, 5)
    assert (await latest(redis, keys)).version == 1


def test_the_cli_command_refuses_with_a_clear_error(redis_server):
    r = CliRunner().invoke(build_app(), ["weights", "rollback", "5", "--redis", redis_server.url,
                                         "--run", "nothing-announced"])
    assert r.exit_code == 1 and "version 5 was never announced" in r.output and "none" in r.output
