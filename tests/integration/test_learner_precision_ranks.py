"""The recipe's numerics on two gloo ranks under FSDP2 with the mixed-precision policy (bf16 compute, fp32
shards, fp32 gradient reduction): at lr 1e-6 every master weight moves, by the amount it moves on one rank
in fp32, and the published bf16 values change as they do on one rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from tests.support.ranks import join_group, leave_group
from tests.support.recipe_numerics import LR, STEPS, RecipeRun, train_recipe
from tests.support.synthetic import qwen2_layer


def _rank(rank: int, world: int, model_path: str, out: str, port: int) -> None:
    torch.set_num_threads(1)
    join_group(rank, world, port)
    from searchr1.learner.train.model import dist_info

    info = dist_info()
    run = train_recipe(Path(model_path), "bfloat16", info)
    if info.is_main:
        save_file(run.delta, str(Path(out) / "delta.safetensors"))
        (Path(out) / "run.json").write_text(json.dumps({"shares": run.published_shares, "stored": str(run.stored)}))
    leave_group(world)


@pytest.mark.timeout(600)
def test_two_bf16_ranks_move_every_master_as_fp32_does(tmp_path):
    from searchr1.core.servers import free_port

    model = qwen2_layer(tmp_path / "m")
    fp32 = train_recipe(model, "float32")
    one = train_recipe(model, "bfloat16")
    mp.spawn(_rank, args=(2, str(model), str(tmp_path), free_port()), nprocs=2, join=True)
    meta = json.loads((tmp_path / "run.json").read_text())
    two = RecipeRun(load_file(str(tmp_path / "delta.safetensors")), meta["shares"], torch.float32)
    assert meta["stored"] == "torch.float32"
    assert two.share_changed() > 0.99
    assert LR <= two.rms() <= STEPS * LR * 1.01
    assert abs(two.rms() / fp32.rms() - 1.0) < 0.05
    # two ranks reduce in fp32 what one rank computes whole: the same update to bf16's precision
    num = sum(float((two.delta[k] - one.delta[k]).double().norm() ** 2) for k in one.delta) ** 0.5
    den = sum(float(one.delta[k].double().norm() ** 2) for k in one.delta) ** 0.5
    assert num / den < 0.1
    assert all(abs(a - b) < 0.01 for a, b in zip(two.published_shares, one.published_shares))
