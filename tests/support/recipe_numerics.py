"""AdamW at the Search-R1 recipe's own numbers (lr 1e-6, weight decay 0.01, clip 1.0, KL 0.001 low_var_kl,
entropy 0.001) through the learner's `build_training`: a few steps on one batch, returning how the fp32
master weights moved and how much of each published version changed. Used by the precision tests on one
rank and on two gloo ranks under FSDP."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

LR = 1e-6
STEPS = 4


def recipe_settings(model_path: Path, dtype: str, device: str = "cpu"):
    """configs/searchr1-3b-grpo.toml's algorithm and optimizer without the warm-up (every step at lr 1e-6)."""
    from searchr1.learner.settings import LearnerSettings

    return LearnerSettings(
        model={"path": str(model_path), "dtype": dtype}, device=device, seed=0,
        algorithm={"advantage": "grpo", "use_kl_loss": True, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl",
                   "entropy_coef": 0.001, "clip_low": 0.2},
        optim={"lr": LR, "weight_decay": 0.01, "grad_clip": 1.0, "warmup_ratio": 0.0, "total_steps": 1005},
        batch={"micro_batch_size": 4})


def masters(policy) -> dict[str, torch.Tensor]:
    """Every trained parameter as a full fp32 CPU tensor (gathered under FSDP: a collective)."""
    out = {}
    for k, v in policy.named_parameters():
        t = v.detach()
        out[k] = (t.full_tensor() if hasattr(t, "full_tensor") else t).float().cpu().clone()
    return out


@dataclass
class RecipeRun:
    delta: dict[str, torch.Tensor]
    """Master weights after the steps minus before (empty on ranks other than 0)."""
    published_shares: list[float]
    """Per step, the share of published values that changed (rank 0)."""
    stored: torch.dtype
    """The dtype the trained parameters are kept in."""

    def share_changed(self) -> float:
        return sum(int((d != 0).sum()) for d in self.delta.values()) / sum(d.numel() for d in self.delta.values())

    def rms(self) -> float:
        n = sum(d.numel() for d in self.delta.values())
        return (sum(float(d.double().norm() ** 2) for d in self.delta.values()) / n) ** 0.5


def train_recipe(model_path: Path, dtype: str, info=None, vocab: int = 2048, device: str = "cpu") -> RecipeRun:
    """`STEPS` recipe steps on one batch of two groups of four (every rank calls it under FSDP)."""
    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.model import DistInfo, export_weights
    from searchr1.weightsync import DeltaSettings, VersionChain
    from tests.support.synthetic import synthetic_group

    info = info or DistInfo()
    torch.manual_seed(0)
    training = build_training(recipe_settings(model_path, dtype, device), info)
    policy = training.trainer.policy
    rng = random.Random(1)
    batch = build_batch([synthetic_group(f"g{i}", group_size=4, vocab=vocab, rng=rng, rewards=[1, 0, 1, 0],
                                         response_len=24) for i in range(2)])
    before = masters(policy)
    chain, shares = VersionChain(DeltaSettings(enabled=False)), []  # the learner's figure of each publication
    if info.is_main:
        chain.plan(0, export_weights(policy, info, training.publish_dtype)[1])
    else:
        export_weights(policy, info, training.publish_dtype)
    for step in range(STEPS):
        training.trainer.train_step(batch, version=0)
        state = export_weights(policy, info, training.publish_dtype)[1]
        if info.is_main:
            shares.append(chain.plan(step + 1, state).figures["published_changed_frac"])
    after = masters(policy)
    stored = next(policy.parameters()).dtype
    delta = {k: after[k] - before[k] for k in before} if info.is_main else {}
    return RecipeRun(delta, shares, stored)
