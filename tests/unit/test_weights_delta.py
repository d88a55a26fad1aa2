"""Weight deltas (`searchr1.weightsync.delta`, `versions`): the bitwise change, the gap encoding, the
delta file, and a worker's verified, undoable application — with hand-checked numbers."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from searchr1.weightsync import (
    BaseWeights,
    Delta,
    DeltaRefused,
    DeltaSettings,
    VersionChain,
    checksum,
    diff,
    write_safetensors,
)
from searchr1.weightsync.delta import changed_positions, encode_patches, gaps, positions_of


def _file(tensors, meta) -> memoryview:
    buf = io.BytesIO()
    write_safetensors(buf, tensors, None, meta)
    return memoryview(bytearray(buf.getvalue()))


def _delta(prev, cur, base=0, version=1, codec="zstd") -> Delta:
    tensors, meta = encode_patches(diff(prev, cur), cur, base=base, version=version, codec=codec)
    return Delta.parse(_file(tensors, meta))


def _copy(state):
    return {k: v.clone() for k, v in state.items()}


def test_a_change_is_a_change_of_bits():
    a = torch.tensor([0.0, 1.0, float("nan"), 2.0], dtype=torch.bfloat16)
    b = torch.tensor([-0.0, 1.0, float("nan"), 2.015625], dtype=torch.bfloat16)  # −0 ≠ +0 in bits; 2 + 1 bf16 ulp
    assert changed_positions(a, b).tolist() == [0, 3]
    assert changed_positions(a, a.clone()).tolist() == []


def test_gaps_by_hand():
    pos = torch.tensor([3, 5, 9, 10], dtype=torch.int64)
    g = gaps(pos)
    assert g.tolist() == [3, 2, 4, 1]
    assert positions_of(memoryview(g).cast("B"), 11).tolist() == [3, 5, 9, 10]
    with pytest.raises(DeltaRefused, match="past the tensor"):
        positions_of(memoryview(g).cast("B"), 10)
    with pytest.raises(DeltaRefused, match="repeat"):
        positions_of(np.array([3, 0], dtype=np.uint32).tobytes(), 11)


def test_diff_density_by_hand():
    prev = {"a": torch.zeros(4, dtype=torch.bfloat16), "b": torch.ones(2, 3, dtype=torch.bfloat16)}
    cur = _copy(prev)
    cur["a"][1] = 0.5
    cur["b"][0, 2] = 3.0
    cur["b"][1, 0] = -1.0
    d = diff(prev, cur)
    assert (d.changed, d.total, d.density) == (3, 10, 0.3)
    assert [(p.name, p.positions.tolist(), p.values.float().tolist()) for p in d.patches] == [
        ("a", [1], [0.5]), ("b", [2, 3], [3.0, -1.0])]
    cur["c"] = torch.zeros(1)
    assert diff(prev, cur) is None  # other names: no delta expresses it
    assert diff(prev, {**prev, "a": torch.zeros(5, dtype=torch.bfloat16)}) is None


@pytest.mark.parametrize("codec", ["zstd", "raw"])
def test_a_chain_of_deltas_reproduces_every_version_bit_for_bit(codec):
    g = torch.Generator().manual_seed(0)
    master = {"w": torch.randn(64, 48, generator=g) * 0.02, "b": torch.randn(48, generator=g) * 0.02}
    published = [{k: v.to(torch.bfloat16) for k, v in master.items()}]
    for _ in range(12):  # fp32 masters moved by ~lr, published in bf16: a few values cross a boundary
        for v in master.values():
            v.add_(torch.randn(v.shape, generator=g) * 2e-4)
        published.append({k: v.to(torch.bfloat16) for k, v in master.items()})
    worker = BaseWeights.of(_copy(published[0]).items(), 0)
    for version in range(1, len(published)):
        d = _delta(published[version - 1], published[version], version - 1, version, codec)
        worker.apply(d)
        assert worker.version == version
        assert all(torch.equal(worker.tensors[k].view(torch.int16), published[version][k].view(torch.int16))
                   for k in master)
        assert worker.sums == {k: checksum(t) for k, t in published[version].items()}


def _pair():
    prev = {"a": torch.arange(8, dtype=torch.bfloat16), "b": torch.zeros(3, dtype=torch.bfloat16)}
    cur = _copy(prev)
    cur["a"][2] = 100.0
    return prev, cur


def test_out_of_order_is_refused_before_anything_changes():
    prev, cur = _pair()
    worker = BaseWeights.of(_copy(prev).items(), 5)
    with pytest.raises(DeltaRefused, match="out of order"):
        worker.apply(_delta(prev, cur, base=4, version=5))
    assert worker.version == 5 and torch.equal(worker.tensors["a"], prev["a"])


def test_a_delta_on_another_base_fails_its_checksum_and_is_undone():
    prev, cur = _pair()
    other = _copy(prev)
    other["a"][7] = -1.0  # the worker's tensor differs where the delta does not write
    worker = BaseWeights.of(_copy(other).items(), 0)
    with pytest.raises(DeltaRefused, match="checksum"):
        worker.apply(_delta(prev, cur))
    assert torch.equal(worker.tensors["a"], other["a"]) and worker.version == 0  # position 2 put back


def test_an_unchanged_tensor_that_differs_is_refused():
    prev, cur = _pair()
    other = _copy(prev)
    other["b"][0] = 1.0
    worker = BaseWeights.of(_copy(other).items(), 0)
    with pytest.raises(DeltaRefused, match="unchanged"):
        worker.apply(_delta(prev, cur))


def test_tampered_values_fail_the_resulting_checksum():
    prev, cur = _pair()
    tensors, meta = encode_patches(diff(prev, cur), cur, base=0, version=1, codec="raw")
    tensors["a:val"] = tensors["a:val"].clone()
    tensors["a:val"][0] ^= 1
    worker = BaseWeights.of(_copy(prev).items(), 0)
    with pytest.raises(DeltaRefused, match="checksum"):
        worker.apply(Delta.parse(_file(tensors, meta)))
    assert torch.equal(worker.tensors["a"], prev["a"])


@pytest.mark.parametrize("threads", [1, 4])
def test_patches_applied_by_a_pool_reach_the_same_bits_and_a_refusal_undoes_every_tensor(threads):
    """Eight tensors patched one at a time or four at once: the same resulting bits; a delta onto a copy
    that differs in two of them is refused and every tensor, the ones that passed included, put back."""
    g = torch.Generator().manual_seed(5)
    prev = {f"t{i}": torch.randn(4096, generator=g).to(torch.bfloat16) for i in range(8)}
    cur = _copy(prev)
    for i, t in enumerate(cur.values()):
        t[torch.randint(0, 4096, (50 + i,), generator=g)] += 1.0
    worker = BaseWeights.of(_copy(prev).items(), 0)
    assert sorted(worker.apply(_delta(prev, cur), threads=threads)) == sorted(cur)
    assert all(torch.equal(worker.tensors[k].view(torch.int16), cur[k].view(torch.int16)) for k in cur)
    other = _copy(prev)
    other["t2"][4095] = 9.0
    other["t6"][4095] = 9.0  # where the delta writes nothing: only the resulting checksums tell
    worker = BaseWeights.of(_copy(other).items(), 0)
    with pytest.raises(DeltaRefused, match="checksum"):
        worker.apply(_delta(prev, cur), threads=threads)
    assert worker.version == 0
    assert all(torch.equal(worker.tensors[k].view(torch.int16), other[k].view(torch.int16)) for k in other)


def test_a_file_that_is_not_a_delta_is_refused():
    with pytest.raises(DeltaRefused, match="not a delta"):
        Delta.parse(_file({"x": torch.zeros(2)}, {}))


def _state(seed, scale=1.0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return {"w": (torch.randn(100, 10, generator=g) * scale).to(dtype)}


def test_the_chain_plans_full_versions_every_k_and_when_a_delta_is_too_big():
    chain = VersionChain(DeltaSettings(full_every=3, max_share=0.5))
    base = _state(0)
    p0 = chain.plan(0, base)
    assert p0.full and p0.delta is None and "published_changed_frac" not in p0.figures
    nudged = _copy(base)
    nudged["w"][0, :5] += 1.0  # 5 of 1,000 values
    p1 = chain.plan(1, nudged)
    assert not p1.full and p1.base == 0 and p1.figures["published_changed_frac"] == 0.005
    assert p1.figures["published_bytes"] == p1.figures["published_delta_bytes"] < 0.5 * 2000
    again = _copy(nudged)
    again["w"][1, 0] += 1.0
    p2 = chain.plan(2, again)
    assert not p2.full and p2.base == 1
    p3 = chain.plan(3, again)  # every 3rd version: a full beside the delta (no value changed)
    assert p3.full and p3.base == 2 and p3.figures["published_changed_frac"] == 0.0
    p4 = chain.plan(4, _state(1))  # nearly every value changed: the delta would exceed half the full
    assert p4.full and p4.delta is None and p4.figures["published_changed_frac"] > 0.9
    p6 = chain.plan(6, _state(1))  # not the version after the previous one: full
    assert p6.full and p6.delta is None
    off = VersionChain(DeltaSettings(enabled=False))
    off.plan(0, base)
    p = off.plan(1, nudged)
    assert p.full and p.delta is None and p.figures["published_changed_frac"] == 0.005


def test_the_newest_version_is_rebuilt_as_a_full_snapshot(tmp_path):
    """Written without Redis (as `train --replay` does): fulls at 0 and 3, deltas between and after; the
    newest version (5, a delta) is rebuilt from full 3 and deltas 4 and 5, bit for bit, and loads."""
    import asyncio

    from safetensors.torch import load_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from searchr1.streams import StreamKeys
    from searchr1.weightsync import SnapshotTransport, WeightPublisher, materialize, newest_version

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=True))
    masters = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    pub = WeightPublisher(tmp_path / "w", keep=2)
    transport = SnapshotTransport(pub, None, StreamKeys("m"), chain=VersionChain(DeltaSettings(full_every=3, max_share=1.0)))
    states = []
    for v in range(6):
        for t in masters.values():
            t.add_(torch.randn(t.shape) * 1e-3)
        states.append({k: t.to(torch.bfloat16) for k, t in masters.items()})
        asyncio.run(transport.publish(v, model, dict(states[-1])))
    assert pub.versions() == [0, 3] and pub.deltas() == [1, 2, 3, 4, 5] and newest_version(pub.root) == 5
    path = materialize(pub.root)
    assert path == pub.path(5) and pub.versions() == [0, 3, 5]
    got = load_file(str(path / "model.safetensors"))
    assert got.keys() == states[5].keys() and all(torch.equal(got[k], states[5][k]) for k in got)
    assert (path / "config.json").is_file() and materialize(pub.root) == path  # written once
