"""The guarded response on a real learner (tiny Qwen2, real Redis): two healthy steps, then a forced
collapse (every group scores 0). After `patience` unhealthy steps the learner rolls back to the last
healthy checkpoint, cuts the learning rate, publishes the rolled-back weights as a new version and records
the event; the next collapse, with its rollbacks spent, stops it with a clear message."""

from __future__ import annotations

import asyncio
import json
import random

import torch
from safetensors.torch import load_file

from searchr1.learner.compose import build_learner
from searchr1.learner.metrics import StepLog
from searchr1.learner.parts import Outputs, RedisSide
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.build import build_training
from searchr1.learner.train.model import DistInfo
from searchr1.streams import StreamKeys, trajectories_stream
from searchr1.weightsync import latest
from tests.support.synthetic import synthetic_group, tiny_qwen2

torch.set_num_threads(1)


def _settings(tmp_path, redis_url, model_path) -> LearnerSettings:
    return LearnerSettings(
        redis={"url": redis_url, "run": "g"}, model={"path": str(model_path)},
        algorithm={"advantage": "grpo", "max_staleness": 100}, optim={"lr": 1e-2, "total_steps": 100},
        batch={"groups_per_step": 2, "micro_batch_size": 4, "max_seq_len": 64},
        weights={"dir": str(tmp_path / "weights"), "keep": 10},
        checkpoint={"dir": str(tmp_path / "ckpt"), "keep": 10}, log_dir=str(tmp_path / "logs"), device="cpu",
        visibility_timeout_ms=200, read_block_ms=100,
        guard={"enabled": True, "above": {}, "below": {"reward_mean": 0.1}, "patience": 2, "lr_factor": 0.5,
               "max_rollbacks": 1})


async def test_forced_collapse_rolls_back_once_then_stops(tmp_path, redis, redis_server):
    model_path = tiny_qwen2(tmp_path / "model", vocab=256, hidden=64)
    s = _settings(tmp_path, redis_server.url, model_path)
    learner = build_learner(s, build_training(s, DistInfo()), redis=RedisSide(redis),
                            outputs=Outputs(StepLog(s.log_dir / "g.jsonl")))
    await learner.start()
    producer = trajectories_stream(redis, StreamKeys("g"))
    rng = random.Random(0)
    healthy = [synthetic_group(f"h{i}", group_size=4, rewards=[1.0, 0.0, 1.0, 0.0], rng=rng) for i in range(4)]
    # a collapsed policy: every answer wrong (GRPO groups with no signal; the reward bound catches them)
    collapsed = [synthetic_group(f"c{i}", group_size=4, rewards=[0.0] * 4, rng=rng) for i in range(8)]
    await producer.publish_many(healthy + collapsed)
    stop = asyncio.Event()
    state = await asyncio.wait_for(learner.run(stop, max_steps=20), timeout=120)

    assert state.step == 6, "2 healthy steps, 2 collapsed (rollback), 2 collapsed (stop)"
    events = [json.loads(line) for line in (tmp_path / "ckpt" / "guard-events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["guard_rollback", "guard_stop"]
    rb = events[0]
    assert (rb["step"], rb["first_bad_step"], rb["checkpoint"]) == (4, 3, "step00000001")
    assert rb["reasons"] == ["reward_mean 0 < 0.1"] and rb["lr"] == 5e-3
    # the rolled-back weights are announced as a new version (5) and equal the step-1 checkpoint's policy
    # (step 3's figures are measured on step 2's weights, so checkpoint 2 is not trusted)
    assert rb["version"] == 5
    ckpt = load_file(str(tmp_path / "ckpt" / "step00000001" / "policy.safetensors"))
    published = {}
    for f in sorted(learner.publisher.path(5).glob("*.safetensors")):
        published.update(load_file(str(f)))
    shared = [k for k in published if k in ckpt]
    assert shared and all(torch.equal(published[k].float(), ckpt[k].float()) for k in shared)
    assert learner.training.components[0].optimizer.param_groups[0]["lr"] == 5e-3
    assert events[1]["first_bad_step"] == 5 and events[1]["rollbacks"] == 1
    assert "stopping" in learner.halted and "reward_mean 0 < 0.1" in learner.halted
    reg = learner.metrics.registry
    assert reg.get_sample_value("searchr1_learner_guard_rollbacks_total") == 1
    assert reg.get_sample_value("searchr1_learner_guard_stopped") == 1
    log = [json.loads(line) for line in (tmp_path / "logs" / "g.jsonl").read_text().splitlines()]
    assert [r.get("event") for r in log if "event" in r] == ["guard_rollback", "guard_stop"]
    assert (await latest(redis, StreamKeys("g"))).version == state.version == 7
