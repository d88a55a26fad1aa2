"""Desync detection against a real Redis: two rollout workers' weight loaders (real `WeightLoader`s on the
transformers engine, reloading the learner's snapshots) feed a learner with the desync screen on; one
worker's reload is skipped by the `rollout.skip_reload` fault point (it stamps the new version and keeps
the old weights). The learner flags that worker on the first step its post-fault group reaches, sets the
group aside (dead-lettered with the reason, never trained), asks the worker to re-sync, and trains the
worker's groups again once it has reloaded."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from searchr1.core.faults import FaultPoints
from searchr1.core.schemas import TrajectoryGroup, decode
from searchr1.learner.algo.batch import build_batch
from searchr1.learner.compose import build_learner
from searchr1.learner.metrics import LearnerMetrics, StepLog
from searchr1.learner.parts import Outputs, RedisSide
from searchr1.learner.service import Learner
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.build import build_training
from searchr1.learner.train.model import DistInfo, forward_logprobs
from searchr1.rollout.hf_engine import HfGenerator
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.streams import StreamKeys, trajectories_stream
from searchr1.weightsync import WeightLoader, resync_key
from tests.support.synthetic import synthetic_group
from tests.support.tiny_lm import build_tiny_lm

torch.set_num_threads(1)
KEYS = StreamKeys("t")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("desync") / "tiny")


def _learner(tmp_path, redis_url, redis, model_dir) -> Learner:
    s = LearnerSettings(
        redis={"url": redis_url, "run": "t"}, model={"path": str(model_dir)}, device="cpu",
        algorithm={"advantage": "grpo", "use_kl_loss": False},
        optim={"lr": 1e-2, "total_steps": 100}, batch={"groups_per_step": 2, "micro_batch_size": 4,
                                                        "max_seq_len": 64},
        weights={"dir": str(tmp_path / "weights"), "keep": 3}, checkpoint={"dir": str(tmp_path / "ckpt")},
        log_dir=str(tmp_path / "logs"), read_block_ms=100,
        desync={"enabled": True, "abs_threshold": 1e-3, "ratio": 10.0, "min_tokens": 4})
    metrics = LearnerMetrics()
    training = build_training(s, DistInfo(), metrics.stages)
    return build_learner(s, training, metrics=metrics, redis=RedisSide(redis), outputs=Outputs(StepLog(s.log_dir / "t.jsonl")))


def _sampled(task_id: str, worker_id: str, version: int, engine: HfGenerator) -> TrajectoryGroup:
    """A group whose behaviour log-probs are the worker's engine's own (teacher-forced on its tokens)."""
    g = synthetic_group(task_id, group_size=2, vocab=200, rewards=[1.0, 0.0], policy_version=version,
                        rng=random.Random(task_id))
    batch = build_batch([g])
    with torch.no_grad():
        logp, _ = forward_logprobs(engine._model, batch.input_ids, batch.attention_mask, mask=batch.loss_mask)
    trajs = []
    for i, t in enumerate(g.trajectories):
        p = len(t.prompt_ids)
        row = logp[i, p - 1:p - 1 + len(t.response_ids)].tolist()
        trajs.append(t.model_copy(update={"behavior_logprobs": [lp if m else 0.0 for lp, m in zip(row, t.loss_mask)]}))
    return g.model_copy(update={"trajectories": trajs, "worker_id": worker_id})


async def test_a_worker_that_skipped_a_reload_is_caught_in_one_step(tmp_path, redis, redis_server, model_dir):
    # reloads in order: round 1 → a (1st), b (2nd); round 2 → a (3rd), b (4th: skipped, version stamped anyway)
    faults = FaultPoints("rollout.skip_reload@4")  # one hook for both workers: it counts their reloads together
    learner = _learner(tmp_path, redis_server.url, redis, model_dir)
    await learner.start()
    workers = {w: WeightLoader(redis, KEYS, HfGenerator(str(model_dir)), tmp_path / f"dl-{w}", faults=faults,
                               **RolloutMetrics().loader_callbacks())
               for w in ("a", "b")}
    out = trajectories_stream(redis, KEYS)
    stop, flagged_at = asyncio.Event(), None
    for rnd in range(5):
        for w, loader in workers.items():
            if await loader.take_resync(w) is not None:
                assert await loader.resync()
            else:
                await loader.maybe_update()
            await out.publish(_sampled(f"{w}{rnd}", w, loader.version, loader.generator))
        assert await learner.step_once(stop)
        if flagged_at is None and await redis.exists(resync_key(KEYS, "b")):
            flagged_at = rnd
    assert flagged_at == 2, "caught on the first step holding a group sampled after the skipped reload"
    dead = [(decode(TrajectoryGroup, f[b"payload"]).task.task_id, f[b"reason"].decode())
            for _, f in await redis.xrange(KEYS.dead)]
    assert [t for t, _ in dead] == ["b2"], dead
    assert "desync: worker b" in dead[0][1] and "peers' median" in dead[0][1]
    trained = learner.state.consumed
    assert "b2" not in trained
    assert {"a0", "a1", "a2", "a3", "a4", "b0", "b1", "b3", "b4"} <= trained, "after the re-sync b trains again"
    assert learner.metrics.registry.get_sample_value("searchr1_learner_desync_flags_total") == 1
    assert learner.metrics.registry.get_sample_value("searchr1_learner_groups_dropped_total",
                                                     {"reason": "desync"}) == 1
