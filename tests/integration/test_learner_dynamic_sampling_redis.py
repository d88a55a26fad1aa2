"""DAPO's filters in the learner loop against a real Redis: dynamic sampling reads past groups of equal
rewards until the step has enough informative ones (counted, acked, never trained on) and stops with a
clear error when a run only produces such groups; overlong filtering masks truncated responses."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch

from searchr1.learner.compose import build_learner
from searchr1.learner.metrics import StepLog
from searchr1.learner.parts import Outputs, RedisSide
from searchr1.learner.service import Learner
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.build import build_training
from searchr1.learner.train.model import DistInfo
from searchr1.streams import StreamKeys, trajectories_stream
from tests.support.synthetic import synthetic_group, tiny_qwen2

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("model") / "tiny", vocab=256, hidden=64)


def _learner(tmp_path, redis, redis_url, model_path, **algorithm) -> Learner:
    s = LearnerSettings(
        redis={"url": redis_url, "run": "t"}, model={"path": str(model_path)}, device="cpu",
        algorithm={"advantage": "grpo", "use_kl_loss": False, "dynamic_sampling": True, **algorithm},
        optim={"lr": 1e-2, "total_steps": 100},
        batch={"groups_per_step": 2, "micro_batch_size": 4, "max_seq_len": 64},
        weights={"dir": str(tmp_path / "weights")}, checkpoint={"dir": str(tmp_path / "ckpt")},
        log_dir=str(tmp_path / "logs"), visibility_timeout_ms=60_000, read_block_ms=100)
    return build_learner(s, build_training(s, DistInfo()), redis=RedisSide(redis),
                         outputs=Outputs(StepLog(s.log_dir / "t.jsonl")))


def _group(name: str, rewards: list[float]):
    return synthetic_group(name, group_size=len(rewards), rewards=rewards, rng=random.Random(name))


async def test_flat_groups_are_skipped_until_the_step_is_full(tmp_path, redis, redis_server, model_path):
    learner = _learner(tmp_path, redis, redis_server.url, model_path, overlong_filter=True)
    await learner.start()
    cut = _group("mixed1", [1.0, 0.0, 0.0, 0.0])
    cut = cut.model_copy(update={"trajectories": [cut.trajectories[0].model_copy(update={"finish_reason": "length"}),
                                                  *cut.trajectories[1:]]})
    producer = trajectories_stream(redis, StreamKeys("t"))
    await producer.publish_many([_group("solved", [1.0] * 4), _group("failed", [0.0] * 4),
                                 _group("mixed0", [1.0, 0.0, 1.0, 0.0]), _group("failed2", [0.0] * 4), cut])
    assert await learner.step_once(asyncio.Event())
    reg = learner.metrics.registry
    assert reg.get_sample_value("searchr1_learner_groups_total") == 2
    assert reg.get_sample_value("searchr1_learner_groups_dropped_total", {"reason": "flat"}) == 3
    assert learner.state.consumed == {"mixed0", "mixed1"}
    assert await producer.pending() == 0, "flat groups are acked with the step"
    line = json.loads((tmp_path / "logs" / "t.jsonl").read_text().splitlines()[-1])
    assert (line["flat_groups"], line["flat_all_solved"], line["flat_all_failed"]) == (3, 1, 2)
    assert line["sampling_reads"] >= 2 and line["overlong_masked"] == 1


async def test_a_run_of_only_flat_groups_stops_with_a_clear_error(tmp_path, redis, redis_server, model_path):
    learner = _learner(tmp_path, redis, redis_server.url, model_path, dynamic_sampling_max_batches=2)
    await learner.start()
    producer = trajectories_stream(redis, StreamKeys("t"))
    await producer.publish_many([_group(f"flat{i}", [1.0] * 4) for i in range(6)])
    with pytest.raises(RuntimeError, match="dynamic sampling read 2 batches"):
        await learner.step_once(asyncio.Event())
    assert learner.state.step == 0
