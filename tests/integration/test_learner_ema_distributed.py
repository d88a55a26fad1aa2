"""EMA-PG under FSDP on CPU (gloo): two ranks, each averaging the reference shards it holds, end a step
with the same reference (and the same top-k KL figures) as one rank; the gathered checkpoint of the
sharded reference matches too."""

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


def _settings(model_path: Path):
    from searchr1.learner.settings import LearnerSettings

    return LearnerSettings(
        model={"path": str(model_path)}, device="cpu",
        algorithm={"advantage": "grpo", "use_kl_loss": True, "kl_loss_coef": 0.1, "entropy_coef": 0.0,
                   "kl_loss_type": "full_reverse", "kl_topk_tokens": 8, "kl_importance_weight": True,
                   "ref_ema_tau": 0.5, "ref_ema_period": 1},
        optim={"lr": 1e-3, "weight_decay": 0.0}, batch={"groups_per_step": 3, "micro_batch_size": 3,
                                                        "mini_batches": 2},
    )


def _batch(version: int):
    rng = random.Random(version)
    return build_batch([synthetic_group(f"g{i}", group_size=4, rng=rng, policy_version=version) for i in range(3)])


def _train(rank: int, world: int, model_path: str, out: str, port: int) -> None:
    torch.set_num_threads(1)
    join_group(rank, world, port)
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.checkpoint import Checkpointer, TrainState
    from searchr1.learner.train.model import dist_info

    info = dist_info()
    training = build_training(_settings(Path(model_path)), info)
    stats = [training.trainer.train_step(_batch(v), version=v) for v in range(2)]
    Checkpointer(Path(out) / "ckpt", keep=1, info=info).save(TrainState(step=2, version=2), training.components)
    if info.is_main:
        (Path(out) / "stats.json").write_text(json.dumps(stats))
    leave_group(world)


@pytest.mark.timeout(300)
def test_two_ranks_update_the_ema_reference_like_one_rank(tmp_path):
    from searchr1.core.servers import free_port

    model_path = tiny_qwen2(tmp_path / "model", vocab=256, hidden=64)
    one, two = tmp_path / "one", tmp_path / "two"
    _train(0, 1, str(model_path), str(one), 0)
    mp.spawn(_train, args=(2, str(model_path), str(two), free_port()), nprocs=2, join=True)

    s1 = json.loads((one / "stats.json").read_text())
    s2 = json.loads((two / "stats.json").read_text())
    assert s1[1]["kl_loss"] > 0  # the second step sees the moved policy against the moved reference
    for a, b in zip(s1, s2):
        for key in ("loss", "kl_loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    r1 = load_file(str(one / "ckpt" / "step00000002" / "reference.safetensors"))
    r2 = load_file(str(two / "ckpt" / "step00000002" / "reference.safetensors"))
    base = load_file(str(next(model_path.glob("model*.safetensors"))))
    assert r1.keys() == r2.keys()
    assert all(torch.allclose(r1[k], r2[k], atol=1e-5) for k in r1)
    assert sum(not torch.equal(r1[k], base[k]) for k in base if k in r1) > len(base) // 2
