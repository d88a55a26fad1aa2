"""Delta versions end to end on a real Redis: the learner's `SnapshotTransport` publishes bf16 versions of
the tiny model (full every 4th, deltas between), and rollout workers (`WeightLoader` over the transformers
engine, which applies deltas to its verified copy) follow them. After every load the engine's weights are
checked against the published version, value for value:

- a worker one version behind applies the delta; a worker that starts late, or sees an announcement two
  versions ahead (out of order), loads the newest full version and the deltas after it;
- a worker whose copy differs from the version it claims (its resulting tensors fail the published
  checksums) refuses the delta, keeps its weights, and catches up from the newest full;
- a delta whose file was altered on disk is refused (BLAKE3), the worker catching up stops before it and
  stays on the version before, and does not try it again;
- over HTTP (the learner's weight server) the same chain is served and applied;
- on disk: at most `keep` fulls and the deltas after the oldest of them."""

from __future__ import annotations

import pytest
import torch

from searchr1.rollout.hf_engine import HfGenerator
from searchr1.streams import StreamKeys
from searchr1.weightsync import (
    DeltaSettings,
    SnapshotTransport,
    VersionChain,
    WeightLoader,
    WeightPublisher,
    weights_app,
)
from tests.support.delta_versions import Versions
from tests.support.tiny_lm import build_tiny_lm

KEYS = StreamKeys("delta")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("delta") / "model")


def _held(gen: HfGenerator) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in gen._model.state_dict().items()}


def _runs(gen: HfGenerator, published: dict[str, torch.Tensor]) -> bool:
    held = _held(gen)
    return all(torch.equal(held[k], t.float()) for k, t in published.items())


class Forms(list):
    def __call__(self, form: str) -> None:
        self.append(form)


def _worker(redis, gen, root, forms=None, **kw) -> WeightLoader:
    return WeightLoader(redis, KEYS, gen, root, on_form=forms if forms is not None else Forms(), **kw)


async def test_workers_follow_a_chain_of_deltas(redis, model_dir, tmp_path):
    versions = Versions.of(model_dir)
    pub = WeightPublisher(tmp_path / "weights", keep=2)
    transport = SnapshotTransport(pub, redis, KEYS, chain=VersionChain(DeltaSettings(full_every=4)))
    a_forms = Forms()
    a = _worker(redis, HfGenerator(str(model_dir)), tmp_path / "a", a_forms)
    await versions.publish(transport, 0)
    assert transport.figures["published_delta"] == 0.0 and "published_changed_frac" not in transport.figures
    for v in range(1, 8):
        await versions.publish(transport, v)
        f = transport.figures
        assert f["published_delta"] == 1.0 and 0 < f["published_changed_frac"] < 0.5
        expected = f["published_delta_bytes"] + (f["published_full_bytes"] if v == 4 else 0)
        assert expected <= f["published_bytes"] <= expected + (64 << 10)  # + headers, manifests, config files
        assert await a.maybe_update() and a.version == v
        assert _runs(a.generator, versions.published[v])
    # v1: the engine started on the model's own weights (no verified copy): the newest full and the delta
    assert a_forms == ["catch_up"] + ["delta"] * 6
    assert pub.versions() == [0, 4] and pub.deltas() == [1, 2, 3, 4, 5, 6, 7]

    late_forms = Forms()
    late = _worker(redis, HfGenerator(str(model_dir)), tmp_path / "late", late_forms)
    assert await late.maybe_update() and late.version == 7 and late_forms == ["catch_up"]
    assert _runs(late.generator, versions.published[7])

    # out of order: a worker on version 5 sees version 7 announced (6 missed)
    behind = _worker(redis, HfGenerator(str(model_dir)), tmp_path / "behind")
    await behind.catch_up(await _published(redis, 5))
    assert behind.version == 5 and _runs(behind.generator, versions.published[5])
    assert await behind.maybe_update() and behind.version == 7 and _runs(behind.generator, versions.published[7])

    # a copy that differs from the version it claims: the delta's resulting checksums fail, nothing changes
    await versions.publish(transport, 8)
    name = "model.embed_tokens.weight"
    same = (versions.published[7][name] == versions.published[8][name]).reshape(-1).nonzero()
    a.generator._base.tensors[name].view(-1)[int(same[0])] += 1.0  # where the delta writes nothing
    before = len(a_forms)
    assert await a.maybe_update() and a.version == 8
    assert a_forms[before:] == ["delta_refused", "catch_up"]
    assert _runs(a.generator, versions.published[8])

    # more versions: fulls at 8 and 12 → the newest two fulls kept, and the deltas after the oldest
    for v in range(9, 13):
        await versions.publish(transport, v)
    assert pub.versions() == [8, 12] and pub.deltas() == [9, 10, 11, 12]


async def _published(redis, version):
    from searchr1.weightsync import published

    return await published(redis, KEYS, version)


async def test_an_altered_delta_is_refused_and_the_catch_up_stops_before_it(redis, model_dir, tmp_path):
    versions = Versions.of(model_dir)
    pub = WeightPublisher(tmp_path / "weights", keep=2)
    transport = SnapshotTransport(pub, redis, KEYS, chain=VersionChain(DeltaSettings(full_every=10)))
    for v in range(4):
        await versions.publish(transport, v)
    raw = bytearray((pub.delta_path(2) / "model.delta").read_bytes())
    raw[-1] ^= 0x40
    (pub.delta_path(2) / "model.delta").write_bytes(bytes(raw))
    forms = Forms()
    w = _worker(redis, HfGenerator(str(model_dir)), tmp_path / "w", forms)
    assert not await w.maybe_update()
    assert w.version == 1 and _runs(w.generator, versions.published[1]) and forms == ["catch_up"]
    assert not await w.maybe_update()  # the failed version is not tried again
    await versions.publish(transport, 4)  # a newer version: the chain still runs through the altered delta
    assert not await w.maybe_update() and w.version == 1


async def test_deltas_over_http(redis, model_dir, tmp_path):
    from searchr1.core.servers import HttpServer

    versions = Versions.of(model_dir)
    pub = WeightPublisher(tmp_path / "weights", keep=2)
    server = HttpServer(weights_app(pub, token="t0k"), "127.0.0.1", 0)
    await server.start()
    try:
        pub.base_url = f"http://127.0.0.1:{server.port}"
        transport = SnapshotTransport(pub, redis, KEYS, chain=VersionChain(DeltaSettings(full_every=3)))
        forms = Forms()
        w = _worker(redis, HfGenerator(str(model_dir)), tmp_path / "w", forms, token="t0k")
        for v in range(5):
            await versions.publish(transport, v)
            if v:
                assert await w.maybe_update() and w.version == v and _runs(w.generator, versions.published[v])
        assert forms == ["catch_up", "delta", "delta", "delta"]
    finally:
        await server.stop()
