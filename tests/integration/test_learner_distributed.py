"""Data-parallel training with FSDP on CPU (gloo): two ranks on the same data reach the same loss and the
same updated weights as one rank — GRPO, and PPO with its critic — and the gathered checkpoint / weight
snapshot match too."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from searchr1.learner.algo.batch import build_batch
from tests.support.ranks import join_group, leave_group
from tests.support.synthetic import synthetic_group, tiny_qwen2

ALGOS = {
    "grpo": ({"advantage": "grpo", "use_kl_loss": True, "kl_loss_coef": 0.1, "entropy_coef": 0.01},
             {"groups_per_step": 4, "micro_batch_size": 3}),
    # PPO: critic + GAE (whitened across ranks), in-reward KL, two optimizer updates per step
    "ppo": ({"advantage": "gae", "use_kl_loss": False, "kl_in_reward": True, "kl_coef": 0.05},
            {"groups_per_step": 4, "micro_batch_size": 2, "mini_batches": 2}),
}


def _settings(model_path: Path, out: Path, algo: str):
    from searchr1.learner.settings import LearnerSettings

    algorithm, batch = ALGOS[algo]
    return LearnerSettings(
        model={"path": str(model_path)}, device="cpu", algorithm=algorithm,
        optim={"lr": 1e-3, "critic_lr": 1e-3, "weight_decay": 0.0}, batch=batch,
        checkpoint={"dir": str(out / "ckpt")}, weights={"dir": str(out / "weights")},
    )


def _batch():
    """13 rows (3 groups of 4 and a singleton): ranks get 7 and 6 rows, i.e. 3 and 2 micro-batches of 3,
    which FSDP's per-forward collectives only survive because ranks align their micro-batch counts."""
    rng = random.Random(0)
    groups = [synthetic_group(f"g{i}", group_size=4, rng=rng) for i in range(3)]
    return build_batch([*groups, synthetic_group("single", group_size=1, rng=rng, rewards=[1.0])])


def _train(rank: int, world: int, model_path: str, out: str, port: int) -> None:
    torch.set_num_threads(1)
    out_p = Path(out)
    join_group(rank, world, port)
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.checkpoint import Checkpointer, TrainState
    from searchr1.learner.train.model import dist_info, export_weights
    from searchr1.weightsync import WeightPublisher

    info = dist_info()
    for algo in ALGOS:
        out_a = out_p / algo
        settings = _settings(Path(model_path), out_a, algo)
        training = build_training(settings, info)
        stats = training.trainer.train_step(_batch(), version=0)
        Checkpointer(out_a / "ckpt", keep=1, info=info).save(TrainState(step=1, version=1), training.components)
        model, state = export_weights(training.trainer.policy, info)
        if info.is_main:
            WeightPublisher(out_a / "weights", keep=3).write(1, model, state)
            (out_a / "stats.json").write_text(json.dumps(stats))
    leave_group(world)


@pytest.mark.timeout(300)
def test_two_ranks_match_one_rank(tmp_path):
    from searchr1.core.servers import free_port

    model_path = tiny_qwen2(tmp_path / "model", vocab=256, hidden=64)
    one, two = tmp_path / "one", tmp_path / "two"
    _train(0, 1, str(model_path), str(one), 0)
    mp.spawn(_train, args=(2, str(model_path), str(two), free_port()), nprocs=2, join=True)

    for algo in ALGOS:
        _check_same(one / algo, two / algo, model_path, algo)


def _check_same(one: Path, two: Path, model_path: Path, algo: str) -> None:
    s1 = json.loads((one / "stats.json").read_text())
    s2 = json.loads((two / "stats.json").read_text())
    keys = ["loss", "pg_loss", "kl_loss", "entropy", "grad_norm", "approx_kl", "clip_frac"]
    if algo == "ppo":
        keys += ["value_loss", "critic_grad_norm"]
    for key in keys:
        assert s2[key] == pytest.approx(s1[key], rel=1e-4, abs=1e-6), (algo, key)

    w1 = load_file(str(next((one / "weights" / "v00000001").glob("model*.safetensors"))))
    w2 = load_file(str(next((two / "weights" / "v00000001").glob("model*.safetensors"))))
    base = load_file(str(next(model_path.glob("model*.safetensors"))))
    assert w1.keys() == w2.keys()
    changed = 0
    for k in w1:
        assert torch.allclose(w1[k], w2[k], atol=2e-5), (algo, k)
        changed += int(not torch.equal(w1[k], base[k]))
    assert changed > len(w1) // 2, "the update changes the weights"

    c1 = load_file(str(one / "ckpt" / "step00000001" / "policy.safetensors"))
    c2 = load_file(str(two / "ckpt" / "step00000001" / "policy.safetensors"))
    assert c1.keys() == c2.keys()
    # the checkpoint holds the parameters the snapshot above holds: the same tolerance (two ranks sum the
    # gradients in another order than one, and Adam's normalisation carries that rounding into the update)
    worst = max(float((c1[k] - c2[k]).abs().max()) for k in c1)
    assert worst <= 2e-5, (algo, worst)
    o2 = load_file(str(two / "ckpt" / "step00000001" / "policy.optimizer.safetensors"))
    assert any(k.endswith("exp_avg") for k in o2)
