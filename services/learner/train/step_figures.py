"""The trainer's figures: per mini-batch policy and critic sums (share-weighted on each rank, all-reduced
into global values) and the step's totals. No model, no optimizer: what the trainer adds up and reports.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, field, fields
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from searchr1.learner.algo.losses import PolicyLoss
from searchr1.learner.train.model import DistInfo


@dataclass
class PolicyFigures:
    """One mini-batch's policy-update figures: this rank's share-weighted sums, global once all-reduced."""

    loss: float = 0.0
    pg_loss: float = 0.0
    kl_loss: float = 0.0
    entropy: float = 0.0
    clip_frac: float = 0.0
    approx_kl: float = 0.0
    is_weight_mean: float = 0.0

    def add(self, terms: PolicyTerms, weights: Tensor, mask: Tensor, share: float, tokens: float) -> None:
        """Add one micro-batch's terms, weighted by its `share` of the mini-batch (of `tokens` loss tokens)."""
        self.loss += float(terms.loss.detach()) * share
        self.pg_loss += float(terms.pg.loss.detach()) * share
        self.kl_loss += float(terms.kl.detach()) * share
        self.entropy += float(terms.entropy.detach()) * share
        self.clip_frac += float(terms.pg.clip_frac) * share
        self.approx_kl += float(terms.pg.approx_kl) * share
        self.is_weight_mean += float((weights * mask).sum()) / max(tokens, 1.0) if float(mask.sum()) else 0.0


@dataclass(frozen=True)
class PolicyTerms:
    """One micro-batch's policy loss and the terms it sums."""

    loss: Tensor
    """pg − entropy_coef·entropy + kl_loss_coef·kl, aggregated over the micro-batch."""
    pg: PolicyLoss
    entropy: Tensor
    kl: Tensor


@dataclass
class CriticFigures:
    """One mini-batch's critic-update figures: this rank's share-weighted sums, global once all-reduced."""

    value_loss: float = 0.0
    value_clip_frac: float = 0.0


F = TypeVar("F", PolicyFigures, CriticFigures)


@dataclass
class StepStats:
    """Figures of one step (summed over its mini-batches, global over ranks)."""

    values: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.values[key] = self.values.get(key, 0.0) + value

    def add_all(self, figures: PolicyFigures | CriticFigures) -> None:
        for f in fields(figures):
            self.add(f.name, getattr(figures, f.name))


def all_reduce(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum `values` over ranks (as they are without data parallel)."""
    if not info.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_figures(figures: F, info: DistInfo, device: torch.device) -> F:
    """Sum every field over ranks as one float64 tensor, in the dataclass's field order (the same on
    every rank)."""
    return type(figures)(*all_reduce(list(astuple(figures)), info, device))


@dataclass
class RatioExtremes:
    """The step's largest and smallest per-token ratio of the learner's probability to the engine's
    (π_learner / π_behaviour, before any truncation) over the loss tokens: how far the trained policy
    sits from what sampled the tokens (staleness plus the train–inference mismatch). Global once reduced."""

    high: float = float("-inf")
    """Largest log-ratio seen so far."""
    low: float = float("inf")
    """Smallest log-ratio seen so far."""

    def add(self, learner_log_prob: Tensor, behaviour_log_prob: Tensor, mask: Tensor) -> None:
        """Take one micro-batch's tokens into account (positions where `mask` is 0 are ignored)."""
        keep = mask.bool()
        if not bool(keep.any()):
            return
        log_ratio = (learner_log_prob.detach().float() - behaviour_log_prob.float())[keep]
        self.high = max(self.high, float(log_ratio.max()))
        self.low = min(self.low, float(log_ratio.min()))

    def figures(self, info: DistInfo, device: torch.device) -> dict[str, float]:
        """`is_ratio_max` / `is_ratio_min` over every rank ({} when no rank saw a loss token)."""
        high, neg_low = self.high, -self.low
        if info.enabled:
            t = torch.tensor([high, neg_low], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            high, neg_low = t.tolist()
        if high == float("-inf"):
            return {}
        return {"is_ratio_max": math.exp(min(high, 700.0)), "is_ratio_min": math.exp(max(-neg_low, -700.0))}
