"""Chunked snapshot digests end to end: the publisher's manifest, a worker (real Redis, the transformers
engine) that refuses a snapshot with one corrupted chunk before loading anything and keeps the weights it
runs, and a manifest that does not match the announcement refused on both transports."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from searchr1.core.servers import HttpServer
from searchr1.rollout.hf_engine import HfGenerator
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.streams import StreamKeys
from searchr1.weightsync import (
    WEIGHTS_FILE,
    SnapshotError,
    WeightLoader,
    WeightPublisher,
    fetch_snapshot,
    weights_app,
)
from searchr1.weightsync.manifest import MANIFEST, Manifest, snapshot_manifest
from tests.support.tiny_lm import build_tiny_lm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("chunks") / "m")


def _model(model_dir, seed: int):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def _flip(path, offset: int) -> None:
    """Flip one byte of `path` in place (the inode the worker's hard links share)."""
    with path.open("r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def _weights(gen: HfGenerator) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in gen._model.state_dict().items()}  # noqa: SLF001 - the engine's model


async def test_a_corrupted_chunk_is_refused_before_anything_is_loaded(redis, model_dir, tmp_path, caplog):
    keys = StreamKeys("chunks")
    pub = WeightPublisher(tmp_path / "w", keep=5)
    gen = HfGenerator(str(model_dir), threads=1)
    loader = WeightLoader(redis, keys, gen, tmp_path / "dl", **RolloutMetrics().loader_callbacks())
    m1 = _model(model_dir, 1)
    pub.write(1, m1, m1.state_dict())
    assert await loader.load(await pub.announce(redis, keys, 1))
    v1 = _weights(gen)
    assert torch.equal(v1["model.norm.weight"], m1.state_dict()["model.norm.weight"])

    m2 = _model(model_dir, 2)
    path = pub.write(2, m2, m2.state_dict())
    wv2 = await pub.announce(redis, keys, 2)
    size = (path / WEIGHTS_FILE).stat().st_size
    _flip(path / WEIGHTS_FILE, size - 3)  # the last chunk, after the announcement
    assert not await loader.load(wv2)
    assert loader.version == 1
    assert "digest mismatch against its manifest" in caplog.text and "chunk" in caplog.text
    after = _weights(gen)
    assert all(torch.equal(after[k], v1[k]) for k in v1), "nothing of the refused snapshot was loaded"

    m3 = _model(model_dir, 3)
    pub.write(3, m3, m3.state_dict())
    assert await loader.load(await pub.announce(redis, keys, 3))
    assert torch.equal(_weights(gen)["model.norm.weight"], m3.state_dict()["model.norm.weight"])


async def test_a_manifest_not_matching_the_announcement_is_refused_on_both_transports(redis, model_dir, tmp_path):
    keys = StreamKeys("manifest")
    pub = WeightPublisher(tmp_path / "w", keep=3)
    model = _model(model_dir, 1)
    path = pub.write(1, model, model.state_dict())
    wv = await pub.announce(redis, keys, 1)
    assert [f.name for f in Manifest.parse((path / MANIFEST).read_bytes()).files] == [
        "config.json", "generation_config.json", WEIGHTS_FILE]
    # whoever can write the volume substitutes the weights and writes a manifest to match them
    other = _model(model_dir, 2)
    pub.write(9, other, other.state_dict())
    (path / WEIGHTS_FILE).unlink()
    (pub.path(9) / WEIGHTS_FILE).rename(path / WEIGHTS_FILE)
    (path / MANIFEST).write_bytes(snapshot_manifest(path))
    with pytest.raises(SnapshotError, match="mismatch for the manifest"):
        await fetch_snapshot(wv, tmp_path / "dl")

    server = HttpServer(weights_app(pub))
    await server.start()
    try:
        with pytest.raises(SnapshotError, match="mismatch for the manifest"):
            await fetch_snapshot(wv.model_copy(update={"uri": f"{server.url}/weights/1"}), tmp_path / "http-dl")
        # the manifest left as announced, one chunk of the weights changed: refused at that chunk
        fresh = _model(model_dir, 3)
        good = pub.write(2, fresh, fresh.state_dict())
        wv2 = await pub.announce(redis, keys, 2)
        _flip(good / WEIGHTS_FILE, 100)
        with pytest.raises(SnapshotError, match="chunk 0 .*mismatch"):
            await fetch_snapshot(wv2.model_copy(update={"uri": f"{server.url}/weights/2"}), tmp_path / "http-dl")
    finally:
        await server.stop()
    assert not list((tmp_path / "http-dl").iterdir()), "nothing refused is kept"


async def test_the_http_download_keeps_the_manifest_and_loads_verified(redis, model_dir, tmp_path):
    keys = StreamKeys("httpload")
    pub = WeightPublisher(tmp_path / "w", keep=3, base_url="http://placeholder")
    model = _model(model_dir, 4)
    pub.write(1, model, model.state_dict())
    server = HttpServer(weights_app(pub))
    await server.start()
    try:
        pub.base_url = server.url
        wv = await pub.announce(redis, keys, 1)
        got = await fetch_snapshot(wv, tmp_path / "dl")
    finally:
        await server.stop()
    assert (got / MANIFEST).read_bytes() == (pub.path(1) / MANIFEST).read_bytes()
    gen = HfGenerator(str(model_dir), threads=1)
    await gen.reload(str(got), wv.sha256)
    assert torch.equal(_weights(gen)["model.norm.weight"], model.state_dict()["model.norm.weight"])
    with pytest.raises(SnapshotError):
        await gen.reload(str(got), "0" * 64)
