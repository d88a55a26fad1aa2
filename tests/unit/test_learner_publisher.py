"""The weight publisher: atomic snapshot directories written in `save_pretrained`'s layout and digested
as they are written, pruning, and the HTTP files protocol."""

from __future__ import annotations

import io
import json

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save

from searchr1.weightsync import (
    WeightPublisher,
    snapshot_digest,
    snapshot_listing,
    weights_app,
    write_safetensors,
)
from searchr1.weightsync.manifest import MANIFEST, ChunkHasher, Manifest, hash_pool, manifest_digest


def tiny(seed: int, dtype=torch.float32):
    from searchr1.world.model import random_model
    from searchr1.world.settings import ModelSettings

    settings = ModelSettings(hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=64,
                             max_position=256, init_seed=seed)
    return random_model(settings, 64, pad_token_id=0, eos_token_id=1).to(dtype)


def publish(pub: WeightPublisher, version: int, model):
    return pub.write(version, model, model.state_dict())


def test_write_replace_and_prune(tmp_path):
    pub = WeightPublisher(tmp_path / "w", keep=2)
    models = [tiny(seed) for seed in range(4)]
    for v, m in enumerate(models):
        publish(pub, v, m)
        pub.prune(keep_version=v)
    assert pub.versions() == [2, 3]
    again = tiny(9)
    publish(pub, 3, again)
    loaded = load_file(pub.path(3) / "model.safetensors")
    assert torch.equal(loaded["model.embed_tokens.weight"], again.state_dict()["model.embed_tokens.weight"])
    assert not [p for p in (tmp_path / "w").iterdir() if p.name.startswith(".")], "no temp dirs left"
    assert pub.uri(3) == str(pub.path(3))
    assert WeightPublisher(tmp_path / "w", keep=3, base_url="http://h:1/").uri(3) == "http://h:1/weights/3"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("untied", [True, False])
def test_snapshot_loads_like_save_pretrained(tmp_path, dtype, untied):
    """Same files as `save_pretrained`, tensors bit-identical (a tied output embedding stored once),
    loadable by transformers in its dtype."""
    from transformers import AutoModelForCausalLM

    model = tiny(0, dtype)
    state = model.state_dict()
    if untied:  # as the learner exports it
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    path = WeightPublisher(tmp_path / "w", keep=3).write(1, model, state)
    model.save_pretrained(tmp_path / "hf", state_dict=state, safe_serialization=True)
    assert snapshot_listing(path) == sorted(snapshot_listing(tmp_path / "hf") + [MANIFEST])
    assert (path / "config.json").read_text() == (tmp_path / "hf" / "config.json").read_text()
    ours, theirs = load_file(path / "model.safetensors"), load_file(tmp_path / "hf" / "model.safetensors")
    assert ours.keys() == theirs.keys() and "lm_head.weight" not in ours
    assert all(torch.equal(ours[k], theirs[k]) and ours[k].dtype == dtype for k in ours)
    back = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))


def test_write_safetensors_matches_the_library_and_feeds_the_digest():
    tensors = {"b": torch.arange(6, dtype=torch.int64).reshape(2, 3), "a": torch.ones(3, dtype=torch.bfloat16),
               "c": torch.tensor(2.5), "t": torch.arange(8.0).reshape(2, 4).t()}  # 0-d and non-contiguous
    buf = io.BytesIO()
    with hash_pool() as pool:
        fed = ChunkHasher(pool, 64)
        n = write_safetensors(buf, tensors, fed.feed)
        fed_digests = fed.digests()
    data = buf.getvalue()
    assert n == len(data)
    from safetensors.torch import load

    loaded = load(data)
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    header_len = int.from_bytes(data[:8], "little")
    assert header_len % 8 == 0
    header = json.loads(data[8:8 + header_len])
    assert header.pop("__metadata__") == {"format": "pt"}
    for name, entry in header.items():  # every tensor aligned to its element size, as the library lays them
        assert entry["data_offsets"][0] % tensors[name].element_size() == 0
    assert load(save({k: v.contiguous() for k, v in tensors.items()})).keys() == loaded.keys()
    with hash_pool() as pool:
        ref = ChunkHasher(pool, 64)
        ref.feed(data)
        assert fed_digests == ref.digests() and len(fed_digests) == -(-len(data) // 64)
    with pytest.raises(ValueError, match="complex64"):
        write_safetensors(io.BytesIO(), {"z": torch.zeros(2, dtype=torch.complex64)})


def test_digest_is_computed_while_writing_and_recomputed_after_a_change(tmp_path):
    pub = WeightPublisher(tmp_path / "w", keep=3)
    path = publish(pub, 5, tiny(0))
    written = pub.digest(5)
    assert written == snapshot_digest(path) == manifest_digest((path / MANIFEST).read_bytes())
    m = Manifest.parse((path / MANIFEST).read_bytes())
    assert [f.name for f in m.files] == ["config.json", "generation_config.json", "model.safetensors"]
    assert [f.size for f in m.files] == [(path / f.name).stat().st_size for f in m.files]
    (path / "config.json").write_text("{}")  # the files are no longer the ones written
    assert pub.digest(5) == snapshot_digest(path) != written
    assert manifest_digest((path / MANIFEST).read_bytes()) == pub.digest(5)  # the manifest written again
    fresh = WeightPublisher(tmp_path / "w", keep=3)  # a restarted learner has no digest cached
    assert fresh.digest(5) == snapshot_digest(path)


def test_http_files_protocol(tmp_path):
    pub = WeightPublisher(tmp_path / "w", keep=3)
    path = publish(pub, 7, tiny(0))
    client = TestClient(weights_app(pub))
    names = client.get("/weights/7/files").json()
    assert names == snapshot_listing(pub.path(7)) == ["config.json", "generation_config.json", "model.safetensors",
                                                      MANIFEST]
    assert client.get("/weights/7/files/model.safetensors").content == (path / "model.safetensors").read_bytes()
    assert client.get("/weights/8/files").status_code == 404
    assert client.get("/weights/7/files/nope.bin").status_code == 404
    assert client.get("/weights/7/files/../../secret").status_code == 404
    assert client.get("/weights/abc/files").status_code == 422
