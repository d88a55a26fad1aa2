"""A rollout worker's weight loader against a real Redis trusts only what the run's current learner
published: an announcement (or a broadcast's recovery snapshot) made with an older fencing token than the
newest the worker has seen is refused, and so is a version the learner never published (an announcement
record written without `announce`, or one whose uri/digest differ from the published one)."""

from __future__ import annotations

from searchr1.core.schemas import WeightVersion, encode
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.streams import StreamKeys
from searchr1.weightsync import WeightLoader, announce, record_snapshot, snapshot_digest


class _Engine:
    """Reloads recorded; no `engine`, so a broadcast receive fails and the loader catches up."""

    def __init__(self) -> None:
        self.reloads: list[str] = []

    async def reload(self, path: str, digest=None) -> None:
        self.reloads.append(path)


def _snapshot(root, version: int, data: bytes) -> WeightVersion:
    d = root / f"v{version:08d}-{data.hex()}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(data)
    return WeightVersion(version=version, uri=str(d), sha256=snapshot_digest(d))


def _loader(redis, keys, tmp_path) -> tuple[WeightLoader, _Engine, RolloutMetrics]:
    engine, metrics = _Engine(), RolloutMetrics()
    return WeightLoader(redis, keys, engine, tmp_path / "dl", **metrics.loader_callbacks()), engine, metrics


async def test_an_announcement_with_an_older_fencing_token_than_seen_is_never_loaded(redis, tmp_path):
    keys = StreamKeys("fence")
    loader, engine, metrics = _loader(redis, keys, tmp_path)
    await announce(redis, keys, _snapshot(tmp_path / "w", 1, b"one"), fence=5)
    assert await loader.maybe_update() and loader.version == 1 and loader.fence == 5
    # Redis comes back from older data (or a stale learner rewrote the record): the weights hash no longer
    # holds token 5, so the stale learner's announcement with token 3 gets in
    await redis.delete(keys.weights)
    await announce(redis, keys, _snapshot(tmp_path / "w", 2, b"stale"), fence=3)
    assert not await loader.maybe_update() and not await loader.maybe_update()
    assert loader.version == 1 and len(engine.reloads) == 1
    assert metrics.weight_refusals._value.get() == 1  # refused once, not at every poll
    # the current learner (token 5 or newer) announces again: loaded
    await announce(redis, keys, _snapshot(tmp_path / "w", 3, b"three"), fence=6)
    assert await loader.maybe_update() and loader.version == 3 and loader.fence == 6
    assert len(engine.reloads) == 2


async def test_a_version_the_learner_never_published_is_never_loaded(redis, tmp_path):
    keys = StreamKeys("unpublished")
    loader, engine, metrics = _loader(redis, keys, tmp_path)
    v1 = _snapshot(tmp_path / "w", 1, b"one")
    await announce(redis, keys, v1, fence=2)
    assert await loader.maybe_update() and loader.version == 1
    # a record written straight into the announcement hash, not through `announce`: never published
    forged = _snapshot(tmp_path / "w", 2, b"forged")
    await redis.hset(keys.weights, mapping={b"latest": encode(forged), b"version": 2, b"fence": 2})
    assert not await loader.maybe_update() and loader.version == 1
    # the published version 1, pointed at other bytes: the digest does not match the published record
    other = _snapshot(tmp_path / "w", 1, b"other")
    await redis.hset(keys.weights, mapping={b"latest": encode(other), b"version": 1, b"fence": 2})
    assert not await loader.maybe_update() and loader.version == 1
    assert engine.reloads == [engine.reloads[0]] and metrics.weight_refusals._value.get() == 2
    # what the learner publishes is loaded
    v2 = _snapshot(tmp_path / "w", 2, b"two")
    await announce(redis, keys, v2, fence=2)
    assert await loader.maybe_update() and loader.version == 2 and len(engine.reloads) == 2


async def test_a_stale_learners_recovery_snapshot_is_not_caught_up_from(redis, tmp_path):
    keys = StreamKeys("catchup")
    loader, engine, _ = _loader(redis, keys, tmp_path)
    broadcast = WeightVersion(version=4, uri="broadcast://127.0.0.1:1/g0/v4", sha256="a" * 64)
    await record_snapshot(redis, keys, _snapshot(tmp_path / "w", 3, b"old-learner"), fence=3)
    await announce(redis, keys, broadcast, fence=5)
    # the broadcast cannot be received here (no engine), so the loader would catch up from the snapshot,
    # but that snapshot was recorded under token 3 and the announcement it follows carries 5
    assert not await loader.maybe_update() and loader.version == 0 and engine.reloads == []
    assert loader.fence == 5
    await record_snapshot(redis, keys, _snapshot(tmp_path / "w", 4, b"current"), fence=5)
    await announce(redis, keys, broadcast.model_copy(update={"version": 5, "sha256": "b" * 64}), fence=5)
    assert await loader.maybe_update() and loader.version == 4 and len(engine.reloads) == 1
