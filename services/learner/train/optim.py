"""The learner's optimizer and learning-rate schedule: AdamW over the trainable parameters and a LambdaLR
stepped once per training step (veRL's warm-up, cosine with a floor, or linear decay)."""

from __future__ import annotations

import math

import torch
from torch import nn

from searchr1.learner.settings import LearnerSettings

LR_SCHEDULES = ("constant", "cosine", "linear")


def lr_lambda(total_steps: int, warmup_steps: int, schedule: str, min_lr_ratio: float):
    """The learning-rate factor at training step `step` (0-based; LambdaLR calls it once per step).

    A linear warm-up 0 → 1 over `warmup_steps` (veRL's constant-with-warm-up), then `schedule` over the
    remaining steps up to `total_steps`: "constant" stays at 1; "cosine" (veRL's cosine, Hugging Face's
    cosine_with_min_lr) and "linear" fall from 1 to `min_lr_ratio` at `total_steps` and stay there.
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; expected one of {sorted(LR_SCHEDULES)}")
    decay_steps = max(1, total_steps - warmup_steps)

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return step / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
        return min_lr_ratio + (1.0 - min_lr_ratio) * shape

    return factor


def build_optimizer(model: nn.Module, lr: float, settings: LearnerSettings, warmup_ratio: float):
    """AdamW over trainable parameters plus its LambdaLR schedule, stepped once per training step (as
    veRL does: `total_steps` and the warm-up count training steps, whatever `mini_batches` is)."""
    o = settings.optim
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    warmup = int(warmup_ratio * o.total_steps)
    factor = lr_lambda(o.total_steps, warmup, o.lr_schedule, o.min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return optimizer, scheduler
