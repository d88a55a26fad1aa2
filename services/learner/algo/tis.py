"""Truncated importance sampling (TIS) for the train–inference mismatch, and the mismatch's figures.

The engine (vLLM) and the learner compute different probabilities for the same token under the same
weights (other kernels, other reduction orders, bf16 vs fp32). A policy gradient on tokens sampled by
the engine then is slightly off-policy. TIS (Yao et al. 2025, "Your efficient RL framework secretly brings
you off-policy RL training"; veRL's `tis_imp_ratio_cap`, SkyRL's `tis`) weights each sampled token by
`min(π_learner(y) / π_engine(y), C)`, with π_learner the learner's log-prob before the update (π_old) and
π_engine the behaviour log-prob the engine returned. Multiplying the advantages by the weights equals
veRL's multiplying the per-token PPO loss by them (the weights are positive and detached).

Rows already corrected as off-policy (decoupled PPO's weights on stale groups, `losses.
truncated_importance_weights`) are left alone: both weights estimate the same ratio.

Pure functions on tensors; the trainer calls `apply_tis` once per micro-batch when `algorithm.tis_cap` is
set, and the real-model tests report `mismatch_figures`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def tis_weights(learner_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Per-token `min(exp(learner − engine), cap)` on `mask`, 1 elsewhere; detached. `cap` ≥ 1."""
    if cap < 1.0:
        raise ValueError(f"TIS cap must be >= 1, got {cap}")
    m = mask.bool()
    log_w = torch.where(m, learner_log_prob.detach() - engine_log_prob.detach(), torch.zeros_like(learner_log_prob))
    return torch.clamp(torch.exp(log_w), max=cap)


def apply_tis(advantages: Tensor, weights: Tensor, learner_log_prob: Tensor, engine_log_prob: Tensor,
              mask: Tensor, cap: float, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Multiply the advantages ([B] or [B, T]) of the rows selected by `rows` ([B] bool: the on-policy
    ones) by their TIS weights. Returns (per-token advantages [B, T], the weights in use [B, T])."""
    w = tis_weights(learner_log_prob, engine_log_prob, mask, cap)
    w = torch.where(rows.bool().unsqueeze(-1), w, torch.ones_like(w))
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    return adv * w, weights * w


@dataclass(frozen=True)
class MismatchFigures:
    """Train–inference mismatch over the sampled tokens of a batch."""

    tokens: int
    mean_abs_diff: float
    """Mean |log π_learner − log π_engine| per sampled token."""
    max_abs_diff: float
    ratio_p01: float
    ratio_p50: float
    ratio_p99: float
    """Quantiles of the importance ratio π_learner / π_engine."""
    ratio_min: float
    ratio_max: float
    frac_capped: float
    """Share of tokens whose ratio exceeds the cap (what TIS would truncate)."""


def mismatch_figures(learner_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor,
                     cap: float = 2.0) -> MismatchFigures:
    """Figures of the per-token log-prob gap on `mask` (tensors of one shape; float)."""
    m = mask.bool()
    d = (learner_log_prob.double() - engine_log_prob.double())[m]
    if d.numel() == 0:
        raise ValueError("no sampled tokens under the mask")
    ratio = torch.exp(d)
    q = torch.quantile(ratio, torch.tensor([0.01, 0.5, 0.99], dtype=ratio.dtype))
    return MismatchFigures(
        tokens=int(d.numel()), mean_abs_diff=float(d.abs().mean()), max_abs_diff=float(d.abs().max()),
        ratio_p01=float(q[0]), ratio_p50=float(q[1]), ratio_p99=float(q[2]),
        ratio_min=float(ratio.min()), ratio_max=float(ratio.max()), frac_capped=float((ratio > cap).double().mean()))
