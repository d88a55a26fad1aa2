"""The broadcast weight transport with real vLLM CPU engines under gloo: the test process is the learner
(rank 0), two engines started with the `BroadcastWeightReceiver` worker extension are the receivers.
One broadcast of a perturbed model reaches both, each receiver's digest equals the sender's, and their
greedy tokens and log-probs equal those of an engine that loaded the same weights from the snapshot
directory. A receiver that dies mid-group fails the learner's send within its timeout (no hang); the next
generation re-forms with the survivor and a restarted receiver. A version sent as a delta on the wire
leaves both engines equal to the same version loaded whole."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest
import pytest_asyncio

from searchr1.rollout.engine import TurnRequest
from searchr1.rollout.settings import EngineSettings
from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator
from searchr1.weightsync import WORKER_EXTENSION, Broadcaster, BroadcastFailed, receive_broadcast
from tests.support.tiny_lm import build_tiny_lm, perturb_weights

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT_S = 20


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bcast")
    base = build_tiny_lm(root / "base")
    return base, perturb_weights(base, root / "v1", scale=0.3)


async def _engine(model_dir) -> VllmGenerator:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["SEARCHR1_WEIGHTS_TIMEOUT_S"] = str(TIMEOUT_S)
    return await VllmGenerator.start(VllmEngineConfig(
        model=str(model_dir), engine=EngineSettings(gpu_memory_utilization=0.05, max_model_len=1024,
                                                    dtype="float32", max_num_seqs=8),
        extra={"worker_extension_cls": WORKER_EXTENSION}))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(models):
    base, _ = models
    a, b = await _engine(base), await _engine(base)
    yield a, b
    await a.close()
    await b.close()


def _snapshot_tensors(model_dir):
    from safetensors.torch import load_file

    return sorted(load_file(str(model_dir / "model.safetensors")).items())


async def _greedy(gen: VllmGenerator, tag: str):
    out = await gen.generate(TurnRequest(prompt_ids=list(range(5, 25)), max_tokens=12, temperature=0.0, top_p=1.0, top_k=-1), tag)
    return out.token_ids, out.logprobs


async def _broadcast(bc: Broadcaster, version: int, named, receivers):
    uri = bc.uri(version)
    results = await asyncio.gather(asyncio.to_thread(bc.send, version, named),
                                   *[receive_broadcast(g, uri) for g in receivers], return_exceptions=True)
    return results


async def test_two_engines_receive_one_broadcast_equal_to_the_snapshot(engines, models, tmp_path):
    import shutil

    from searchr1.weightsync import SnapshotError, snapshot_digest

    a, b = engines
    _, v1 = models
    before = await _greedy(a, "before")
    bc = Broadcaster("127.0.0.1", 0, 3, backend="gloo", timeout_s=TIMEOUT_S, bucket_bytes=256 << 10)
    sent, got_a, got_b = await _broadcast(bc, 1, _snapshot_tensors(v1), [a, b])
    assert not isinstance(sent, BaseException), sent
    assert got_a == got_b == sent
    ids_a, lps_a = await _greedy(a, "a-bcast")
    ids_b, lps_b = await _greedy(b, "b-bcast")
    assert (ids_a, lps_a) != before  # the weights did change
    digest = snapshot_digest(v1)
    await b.reload(str(v1), digest)  # the snapshot path, same weights, verified as the engine reads them
    assert set(b.last_load_times) == {"read_verify_s", "load_weights_s", "gemm_repack_s"}
    ids_s, lps_s = await _greedy(b, "b-snapshot")
    assert ids_a == ids_b == ids_s
    assert lps_a == pytest.approx(lps_s, abs=1e-5) and lps_b == pytest.approx(lps_s, abs=1e-5)
    await a.reload(str(v1))  # vLLM's own reader of the directory: the verified bytes load the same weights
    ids_p, lps_p = await _greedy(a, "a-path")
    assert ids_p == ids_s and lps_p == pytest.approx(lps_s, abs=1e-6)
    # the same snapshot with one byte of the weights flipped: refused, the engine's weights untouched
    bad = tmp_path / "bad"
    shutil.copytree(v1, bad)
    raw = bytearray((bad / "model.safetensors").read_bytes())
    raw[-5] ^= 0x20
    (bad / "model.safetensors").write_bytes(raw)
    with pytest.raises(SnapshotError, match="mismatch"):
        await b.reload(str(bad), digest)
    assert await _greedy(b, "b-refused") == (ids_s, lps_s)


_DYING_RECEIVER = textwrap.dedent("""
    import os, sys
    from searchr1.weightsync import Receiver, parse_group_uri
    addr, _ = parse_group_uri(sys.argv[1])
    Receiver(backend="gloo", timeout_s=float(sys.argv[2])).join(addr)
    print("joined", flush=True)
    os._exit(0)  # dies before the publication arrives
""")


async def test_a_dead_receiver_fails_the_send_in_time_and_a_restart_rejoins(engines, models):
    a, _ = engines
    base, v1 = models
    bc = Broadcaster("127.0.0.1", 0, 3, backend="gloo", timeout_s=TIMEOUT_S)
    bc.generation = 7  # a fresh group, apart from the first test's
    named = _snapshot_tensors(base)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    dying = subprocess.Popen([sys.executable, "-c", _DYING_RECEIVER, bc.uri(2), str(TIMEOUT_S)], env=env,
                             stdout=subprocess.PIPE, text=True)
    sent, got_a = await _broadcast(bc, 2, named, [a])
    dying.wait(60)
    assert isinstance(sent, BroadcastFailed), sent
    assert isinstance(got_a, BaseException)  # the survivor's receive failed too: it leaves the group
    assert bc.generation == 8
    # the survivor (which would have loaded the snapshot meanwhile) and a restarted receiver re-form
    restarted = await _engine(base)
    try:
        sent, got_a, got_r = await _broadcast(bc, 3, _snapshot_tensors(v1), [a, restarted])
        assert not isinstance(sent, BaseException), sent
        assert got_a == got_r == sent
        assert await _greedy(a, "a-v3") == await _greedy(restarted, "r-v3")
    finally:
        await restarted.close()


async def test_the_worker_loader_receives_a_broadcast_version_and_catches_up_from_a_snapshot(engines, models,
                                                                                            redis_server, tmp_path):
    """The whole path: the learner's `BroadcastTransport` announces on a real Redis and sends; the rollout's
    `WeightLoader` sees a `broadcast://` version, receives it into the vLLM engine and acknowledges it; a
    version whose broadcast failed is loaded from the recovery snapshot instead."""
    import torch
    from transformers import AutoModelForCausalLM

    from searchr1.rollout.metrics import RolloutMetrics
    from searchr1.streams import StreamKeys, connect
    from searchr1.weightsync import (
        BroadcastTransport,
        WeightLoader,
        WeightPublisher,
        acknowledgements,
        latest,
    )

    a, _ = engines
    _, v1 = models
    redis = connect(redis_server.url)
    keys = StreamKeys("bcast-loader")
    try:
        model = AutoModelForCausalLM.from_pretrained(v1, dtype=torch.float32)
        state = model.state_dict()
        transport = BroadcastTransport(WeightPublisher(tmp_path / "weights", keep=3), Broadcaster("127.0.0.1", 0, 2, backend="gloo", timeout_s=TIMEOUT_S),
                                       redis, keys, snapshot_every=100)
        loader = WeightLoader(redis, keys, a, tmp_path / "dl", **RolloutMetrics().loader_callbacks())

        async def loader_side():
            while (await latest(redis, keys)) is None or (await latest(redis, keys)).version < 5:
                await asyncio.sleep(0.05)
            return await loader.maybe_update()

        _, updated = await asyncio.gather(transport.publish(5, model, state), loader_side())
        assert updated and loader.version == 5
        acks = await acknowledgements(redis, keys)
        assert [v for v, _ in acks.values()] == [5]
        assert await _greedy(a, "loader-v5") == await _greedy(engines[1], "b-v1")  # b holds v1 from the snapshot

        # version 6: the broadcast fails (nobody receives); the learner writes 6 as the recovery snapshot;
        # the worker's receive of 6 fails on the dropped group and it loads the snapshot instead
        await transport.publish(6, model, state)
        assert transport.failures == 1
        assert await loader.maybe_update() and loader.version == 6
        assert [v for v, _ in (await acknowledgements(redis, keys)).values()] == [6]
        transport.close()
    finally:
        await redis.aclose()


async def test_a_delta_broadcast_into_the_engines_equals_the_same_version_loaded_whole(engines, models, tmp_path):
    """Version 11 whole to both engines, then version 12 (3% of the values changed) as a delta on the
    wire: each engine's receiver applies it to its host copy, checks every resulting tensor and hands the
    engine every tensor; the greedy tokens and log-probs equal those of the same version 12 loaded from a
    snapshot directory."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from searchr1.weightsync import DeltaSettings, VersionChain, WireDelta
    from searchr1.weightsync.safetensors import safetensors_bytes

    a, b = engines
    _, v1 = models
    v11 = dict(_snapshot_tensors(v1))
    g = torch.Generator().manual_seed(11)
    v12 = {}
    for name, t in v11.items():
        nxt = t.clone()
        flat = nxt.view(-1)
        flat[torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() * 3 // 100)]] += 0.05
        v12[name] = nxt
    chain = VersionChain(DeltaSettings(max_share=0.9))
    bc = Broadcaster("127.0.0.1", 0, 3, backend="gloo", timeout_s=TIMEOUT_S)
    bc.generation = 20  # a fresh group, apart from the other tests'
    plan = chain.plan(11, v11)
    sent, got_a, got_b = await _broadcast_with(bc, 11, sorted(v11.items()), plan.sums, None, [a, b])
    assert not isinstance(sent, BaseException) and got_a == got_b == sent and bc.last_form == "full"
    plan = chain.plan(12, v12)
    delta = WireDelta(11, safetensors_bytes(plan.delta, plan.delta_metadata))
    sent, got_a, got_b = await _broadcast_with(bc, 12, sorted(v12.items()), plan.sums, delta, [a, b])
    assert not isinstance(sent, BaseException), sent
    assert got_a == got_b == sent and bc.last_form == "delta" and bc.last_bytes * 4 < sum(
        t.numel() * t.element_size() for t in v12.values())
    ids_a, lps_a = await _greedy(a, "a-delta")
    whole = tmp_path / "v12"
    shutil.copytree(v1, whole)
    save_file(v12, str(whole / "model.safetensors"), metadata={"format": "pt"})
    await b.reload(str(whole))
    ids_s, lps_s = await _greedy(b, "b-v12-whole")
    assert ids_a == ids_s and lps_a == pytest.approx(lps_s, abs=1e-5)
    bc.close()


async def _broadcast_with(bc: Broadcaster, version: int, named, sums, delta, receivers):
    uri = bc.uri(version)
    return await asyncio.gather(asyncio.to_thread(lambda: bc.send(version, named, sums=sums, delta=delta)),
                                *[receive_broadcast(g, uri) for g in receivers], return_exceptions=True)
