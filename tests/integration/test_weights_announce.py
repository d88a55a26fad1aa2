"""Weight announcements on a real Redis: latest wins and never goes backwards."""

from __future__ import annotations

from searchr1.core.schemas import WeightVersion
from searchr1.streams import StreamKeys
from searchr1.weightsync import announce, latest

KEYS = StreamKeys("w")


async def test_announce_latest_never_goes_backwards(redis):
    assert await latest(redis, KEYS) is None
    v2 = WeightVersion(version=2, uri="/snap/2", sha256="a" * 64)
    await announce(redis, KEYS, v2)
    assert (await latest(redis, KEYS)) == v2
    assert await redis.hget(KEYS.weights, b"version") == b"2"
    await announce(redis, KEYS, WeightVersion(version=1, uri="/snap/1", sha256="b" * 64))
    assert (await latest(redis, KEYS)).version == 2
    assert await redis.keys("*notify*") == []
    await redis.hset(KEYS.weights, b"latest", b"garbage")
    assert await latest(redis, KEYS) is None


async def test_fetch_snapshot_local_and_http(tmp_path):
    """A snapshot served over HTTP (files listing protocol) downloads and verifies; tampering is refused."""
    import pytest

    from searchr1.weightsync import SnapshotError, fetch_snapshot, snapshot_digest, snapshot_listing
    from tests.support.snapshot_server import serve_snapshot

    snap = tmp_path / "snap"
    (snap / "sub").mkdir(parents=True)
    (snap / "model.safetensors").write_bytes(bytes(range(256)) * 50)
    (snap / "sub" / "config.json").write_text('{"a": 1}')
    digest = snapshot_digest(snap)
    assert snapshot_listing(snap) == ["model.safetensors", "sub/config.json"]

    local = WeightVersion(version=1, uri=f"file://{snap}", sha256=digest)
    pinned = await fetch_snapshot(local, tmp_path / "dl")
    assert pinned == tmp_path / "dl" / f"v00000001-{digest[:16]}" and snapshot_digest(pinned) == digest
    with pytest.raises(SnapshotError, match="mismatch"):
        await fetch_snapshot(WeightVersion(version=1, uri=str(snap), sha256="0" * 64), tmp_path / "dl")

    async with serve_snapshot(snap) as base:
        remote = WeightVersion(version=1, uri=base, sha256=digest)
        got = await fetch_snapshot(remote, tmp_path / "dl")
        assert got == tmp_path / "dl" / f"v00000001-{digest[:16]}" and snapshot_digest(got) == digest
        assert await fetch_snapshot(remote, tmp_path / "dl") == got  # cached
        bad = WeightVersion(version=2, uri=base, sha256="1" * 64)
        with pytest.raises(SnapshotError, match="mismatch"):
            await fetch_snapshot(bad, tmp_path / "dl")
        assert not any(p.name.startswith(("v00000002", ".")) for p in (tmp_path / "dl").iterdir())
        with pytest.raises(SnapshotError, match="cannot download"):
            nowhere = WeightVersion(version=3, uri=base.replace("/weights/1", "/nope"), sha256=digest)
            await fetch_snapshot(nowhere, tmp_path / "dl")


async def test_http_fetch_refuses_corrupted_truncated_and_odd_listings(tmp_path):
    """The digest is checked on the bytes as they arrive: a flipped byte or a truncated file is refused,
    as is a listing naming a file twice; nothing refused is left in the download directory."""
    import pytest
    from fastapi import FastAPI
    from fastapi.responses import Response

    from searchr1.core.servers import HttpServer
    from searchr1.weightsync import SnapshotError, fetch_snapshot, snapshot_digest

    snap = tmp_path / "snap"
    snap.mkdir()
    body = bytes(range(256)) * 40_000  # 10 MB: several chunks
    (snap / "model.safetensors").write_bytes(body)
    (snap / "config.json").write_text("{}")
    digest = snapshot_digest(snap)
    served = {"model.safetensors": body, "config.json": b"{}"}
    listing = ["model.safetensors", "config.json"]  # any order: the client digests in sorted order

    app = FastAPI()

    @app.get("/weights/1/files")
    async def files():
        return listing

    @app.get("/weights/1/files/{name}")
    async def file(name: str):
        return Response(served[name], media_type="application/octet-stream")

    server = HttpServer(app)
    await server.start()
    dl = tmp_path / "dl"
    wv = WeightVersion(version=1, uri=f"{server.url}/weights/1", sha256=digest)
    try:
        got = await fetch_snapshot(wv, dl)
        assert snapshot_digest(got) == digest
        for version, bad in ((2, body[:-1] + bytes([body[-1] ^ 1])), (3, body[: len(body) // 2])):
            served["model.safetensors"] = bad
            with pytest.raises(SnapshotError, match="mismatch"):
                await fetch_snapshot(wv.model_copy(update={"version": version}), dl)
        served["model.safetensors"] = body
        listing.append("config.json")
        with pytest.raises(SnapshotError, match="twice"):
            await fetch_snapshot(wv.model_copy(update={"version": 4}), dl)
        assert sorted(p.name for p in dl.iterdir()) == [f"v00000001-{wv.sha256[:16]}"]
    finally:
        await server.stop()
