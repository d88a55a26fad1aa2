"""The learner's `BroadcastTransport` with a real Redis and real gloo receivers (threads of this process):
a version is announced as a `broadcast://` URI and received intact; a recovery snapshot is written every
`snapshot_every` versions and recorded; a receiver missing from the group fails the broadcast without
stopping the learner, the version is then written as a snapshot for catching up, and the next version
re-forms the group."""

from __future__ import annotations

import pytest
import torch

from searchr1.streams import StreamKeys
from searchr1.weightsync import (
    Broadcaster,
    BroadcastTransport,
    Receiver,
    WeightPublisher,
    acknowledge,
    acknowledgements,
    latest,
    latest_snapshot,
    parse_group_uri,
    snapshot_digest,
)
from tests.support.broadcast import receive_in_thread
from tests.support.tiny_lm import build_tiny_lm

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(build_tiny_lm(tmp_path_factory.mktemp("m") / "tiny"),
                                                dtype=torch.float32)


async def test_broadcast_transport_announces_sends_and_falls_back_to_a_snapshot(redis, model, tmp_path):
    keys = StreamKeys("bt")
    publisher = WeightPublisher(tmp_path / "weights", keep=2)
    bc = Broadcaster("127.0.0.1", 0, 2, backend="gloo", timeout_s=10)
    transport = BroadcastTransport(publisher, bc, redis, keys, snapshot_every=2)
    state = model.state_dict()

    got: dict = {}
    t = receive_in_thread(Receiver(backend="gloo", timeout_s=10), bc.address, 2, got)
    wv = await transport.publish(2, model, state)
    t.join(30)
    assert "error" not in got, got.get("error")
    assert (await latest(redis, keys)) == wv
    assert parse_group_uri(wv.uri) == (bc.address, 2)
    assert torch.equal(got["tensors"]["model.embed_tokens.weight"], state["model.embed_tokens.weight"])
    snap = await latest_snapshot(redis, keys)  # version 2 is a multiple of snapshot_every
    assert snap.version == 2 and snap.sha256 == snapshot_digest(snap.uri)
    assert transport.failures == 0

    # version 3: nobody joins → the broadcast fails in time, training goes on, 3 is written for catching up
    wv3 = await transport.publish(3, model, state)
    assert transport.failures == 1 and bc.generation == 1
    assert (await latest(redis, keys)).version == 3 and parse_group_uri(wv3.uri)[0].generation == 0
    snap = await latest_snapshot(redis, keys)
    assert snap.version == 3 and snap.sha256 == snapshot_digest(snap.uri)

    # version 4: a receiver joins generation 1 and gets it
    got = {}
    t = receive_in_thread(Receiver(backend="gloo", timeout_s=10), bc.address, 4, got)
    wv4 = await transport.publish(4, model, state)
    t.join(30)
    assert "digest" in got and parse_group_uri(wv4.uri)[0].generation == 1
    await acknowledge(redis, keys, "w1", 4, got["digest"])
    assert await acknowledgements(redis, keys) == {"w1": (4, got["digest"])}
    transport.close()
