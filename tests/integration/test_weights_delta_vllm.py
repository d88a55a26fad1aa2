"""Delta versions into a real vLLM CPU engine (searchr1's worker extension): the worker's `WeightLoader`
loads the newest full version and then applies each delta in place; after two deltas the engine's greedy
tokens and log-probs equal those it gives after reloading a full snapshot of the same version, and differ
from the first version's. A delta the engine cannot apply (its copy is at another version: out of order) is
refused inside the engine and its output is unchanged."""

from __future__ import annotations

import os

import pytest
import pytest_asyncio

from searchr1.rollout.engine import TurnRequest
from searchr1.rollout.settings import EngineSettings
from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator
from searchr1.streams import StreamKeys
from searchr1.weightsync import (
    WORKER_EXTENSION,
    DeltaRefused,
    DeltaSettings,
    SnapshotTransport,
    VersionChain,
    WeightLoader,
    WeightPublisher,
    fetch_snapshot,
    published,
)
from tests.support.delta_versions import Versions
from tests.support.tiny_lm import build_tiny_lm

pytestmark = pytest.mark.asyncio(loop_scope="module")
KEYS = StreamKeys("delta-vllm")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("dvllm") / "model")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(model_dir):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    gen = await VllmGenerator.start(VllmEngineConfig(
        model=str(model_dir), engine=EngineSettings(gpu_memory_utilization=0.05, max_model_len=1024,
                                                    dtype="float32", max_num_seqs=8),
        extra={"worker_extension_cls": WORKER_EXTENSION}))
    yield gen
    await gen.close()


async def _greedy(gen: VllmGenerator, tag: str):
    out = await gen.generate(TurnRequest(prompt_ids=list(range(5, 25)), max_tokens=12, temperature=0.0, top_p=1.0,
                                         top_k=-1), tag)
    return out.token_ids, out.logprobs


async def test_deltas_update_the_engine_in_place(engine, model_dir, redis_server, tmp_path):
    from searchr1.streams import connect

    redis = connect(redis_server.url)  # on this module's event loop, where the engine lives
    await redis.flushdb()
    versions = Versions.of(model_dir, step=0.005)
    pub = WeightPublisher(tmp_path / "weights", keep=2)
    transport = SnapshotTransport(pub, redis, KEYS, chain=VersionChain(DeltaSettings(full_every=10, max_share=1.0)))
    forms: list[str] = []
    loader = WeightLoader(redis, KEYS, engine, tmp_path / "dl", on_form=forms.append)
    await versions.publish(transport, 0)
    await versions.publish(transport, 1)
    assert await loader.maybe_update() and loader.version == 1 and forms == ["catch_up"]
    v1 = await _greedy(engine, "v1")
    await versions.publish(transport, 2)
    assert transport.figures["published_delta"] == 1.0
    assert await loader.maybe_update() and loader.version == 2 and forms == ["catch_up", "delta"]
    times = engine.last_load_times
    assert times["changed_tensors"] > 0 and times["load_weights_s"] > 0
    by_delta = await _greedy(engine, "v2-delta")
    assert by_delta[1] != v1[1]
    assert await engine.engine.collective_rpc("searchr1_base_version") == [2]

    # out of order: the delta into version 2 again, while the engine's copy is at version 2
    d2 = await published(redis, KEYS, 2)
    path = await fetch_snapshot(d2, tmp_path / "dl")
    with pytest.raises(DeltaRefused, match="out of order"):
        await engine.apply_delta(str(path), d2.sha256)
    assert await _greedy(engine, "after-refusal") == by_delta

    # the same version as a full snapshot, reloaded: the same tokens and log-probs
    full = WeightPublisher(tmp_path / "full", keep=1)
    full.write(2, versions.model, versions.state(2))
    await engine.reload(str(full.path(2)), full.digest(2))
    assert await _greedy(engine, "v2-full") == by_delta
    await redis.aclose()
