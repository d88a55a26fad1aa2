"""The learner's math: advantages, policy/value/KL/entropy losses and importance weights, as pure tensor
functions (tensors in, tensors out; no model, no I/O, no logging).

Semantics follow Search-R1's veRL 0.1 fork (`verl/trainer/ppo/core_algos.py`) so runs are comparable:

- GRPO outcome advantage: per group `(score - mean) / (std + eps)` with torch's *unbiased* std; a group of
  one gets mean 0 and std 1 (its advantage is its raw score), exactly as veRL does.
- GAE runs the backward recursion over every position, treating positions outside `mask` as value 0 and
  reward 0 (veRL zeroes them through the response mask), then whitens the advantages over `mask` with the
  unbiased masked variance and `rsqrt(var + 1e-8)`; returns are `advantages + values` before whitening.
- PPO clip loss: `max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high))`, clip fraction = share of tokens where the
  clipped term is strictly larger, approx KL = masked mean of `old - new` log-prob.
- KL estimators `kl` (k1), `abs`, `mse` (½·Δ²) and `low_var_kl` (k3, clamped to ±10).
- EMA-PG's (Search-R1's EMA-PG release, arXiv 2602.04417): the sampled estimators `k3plusplus`, `k4`,
  `k5`, whose gradients (not values) differ from k1/k3; `topk_kl`, a forward or reverse KL over the
  top-k tokens per position with a sampled correction for the tail; `kl_importance_weight` π/π_old.
- Clipped value loss `½·mean(max((v-R)², (clip(v, v_old±ε)-R)²))`; entropy from logits.

Departures, each on purpose: masked positions are selected with `torch.where`, so NaN/inf garbage there
changes nothing (veRL multiplies by the mask, which lets NaN through); aggregation modes beyond veRL 0.1's
token-mean (`seq-mean-token-mean`, `seq-mean-token-sum`) and DAPO's asymmetric clip are added; the
trainer normalises over the whole step's loss tokens rather than per micro-batch (see `train/trainer.py`).

The KL estimators live in `kl_estimators.py` and are re-exported here. Variants are chosen by name
from registry dicts (`KL_ESTIMATORS`, `AGGREGATIONS`, `POLICY_LOSSES`),
never by an if-ladder.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from searchr1.learner.algo.kl_estimators import (  # noqa: F401  (re-exported: the KL half of the learner's math)
    KL_ESTIMATORS,
    KL_LOG_RATIO_CLAMP,
    LOW_VAR_KL_CLAMP,
    TOPK_KL_DIRECTIONS,
    kl_importance_weight,
    kl_penalty,
    topk_kl,
)

WHITEN_EPS = 1e-8


# ----------------------------------------------------------------------------- masked reductions


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    """`values` where mask is set, exact zeros elsewhere (garbage, even NaN, never leaks)."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `values` over positions where `mask` is 1."""
    m = _masked(values, mask)
    return m.sum() if dim is None else m.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` over positions where `mask` is 1 (0 when the mask is empty)."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp_min(1.0)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance over masked positions (Bessel-corrected when `unbiased`), like veRL's `masked_var`."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.to(values.dtype).sum()
        var = var * n / (n - 1).clamp_min(1.0)
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """`(x - mean) / sqrt(var + 1e-8)` over masked positions; masked-out positions are returned as 0."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (_masked(values, mask) - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return _masked(whitened, mask)


# ----------------------------------------------------------------------------- loss aggregation


def _token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(loss, mask)


def _seq_mean_token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    per_seq = masked_mean(loss, mask, dim=-1)
    has_tokens = mask.sum(dim=-1) > 0
    return masked_mean(per_seq, has_tokens)


def _seq_mean_token_sum(loss: Tensor, mask: Tensor) -> Tensor:
    per_seq = masked_sum(loss, mask, dim=-1)
    has_tokens = mask.sum(dim=-1) > 0
    return masked_mean(per_seq, has_tokens)


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
}
"""How a [B, T] per-token loss becomes a scalar: `token-mean` = masked mean over every token of the batch
(veRL 0.1, DAPO); `seq-mean-token-mean` = mean over sequences of each one's token mean (the GRPO paper);
`seq-mean-token-sum` = mean over sequences of each one's token sum (Dr. GRPO with a constant divisor)."""


def aggregate(loss: Tensor, mask: Tensor, agg: str = "token-mean") -> Tensor:
    """Reduce a per-token loss with the named aggregation (see `AGGREGATIONS`)."""
    try:
        fn = AGGREGATIONS[agg]
    except KeyError:
        raise ValueError(f"unknown loss aggregation {agg!r}; expected one of {sorted(AGGREGATIONS)}") from None
    return fn(loss, mask)


# ----------------------------------------------------------------------------- advantages


def grpo_advantages(
    scores: Tensor, group_ids: Tensor | Sequence[Hashable], *, eps: float = 1e-6, scale_by_std: bool = True
) -> Tensor:
    """GRPO outcome advantage per trajectory: `(s - mean_g) / (std_g + eps)` over its group g.

    `std` is torch's unbiased std; a singleton group gets mean 0 and std 1 (veRL's rule).
    `scale_by_std=False` gives Dr. GRPO (`s - mean_g`). Returns a float tensor [B]."""
    scores = scores.detach().to(torch.float32).reshape(-1)
    ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(ids) != scores.numel():
        raise ValueError(f"{scores.numel()} scores but {len(ids)} group ids")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    out = torch.empty_like(scores)
    for idx in members.values():
        s = scores[idx]
        if len(idx) == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = s.mean(), s.std(unbiased=True)
        out[idx] = (s - mean) / (std + eps) if scale_by_std else s - mean
    return out


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over [B, T] tensors (veRL's `compute_gae_advantage_return`).

    Positions outside `mask` count as reward 0 and value 0 (a terminal after the last masked token).
    Returns `(advantages, returns)`: advantages whitened over `mask`; returns = raw advantages + values.
    Both are 0 outside the mask."""
    raw, returns = gae_raw(token_rewards, values, mask, gamma, lam)
    return masked_whiten(raw, mask), returns


def gae_raw(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """`gae_advantages` before whitening (for whitening across data-parallel ranks)."""
    rewards = _masked(token_rewards.detach().float(), mask)
    vals = _masked(values.detach().float(), mask)
    T = rewards.shape[-1]
    last = torch.zeros_like(rewards[:, 0])
    out = torch.zeros_like(rewards)
    for t in reversed(range(T)):
        next_value = vals[:, t + 1] if t < T - 1 else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        last = delta + gamma * lam * last
        out[:, t] = last
    return _masked(out, mask), _masked(out + vals, mask)


# ----------------------------------------------------------------------------- policy loss


@dataclass(frozen=True)
class PolicyLoss:
    """A policy-gradient loss and its diagnostics (diagnostics are detached)."""

    loss: Tensor
    """Scalar loss to minimise."""
    clip_frac: Tensor
    """Masked share of tokens where the clipped term was the larger loss."""
    approx_kl: Tensor
    """Masked mean of `old_log_prob - log_prob` (k1 estimate of KL(old‖new))."""


def ppo_clip_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float | None = None,
    agg: str = "token-mean",
) -> PolicyLoss:
    """PPO's clipped surrogate on [B, T] tensors; a [B] advantage is broadcast over T.
    `clip_high` defaults to `clip_low`; a larger `clip_high` is DAPO's clip-higher."""
    clip_high = clip_low if clip_high is None else clip_high
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.detach()
    m = mask.bool()
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    log_ratio = torch.where(m, log_prob - old_log_prob.detach(), zero)
    ratio = torch.exp(log_ratio)
    adv = torch.where(m, advantages.expand_as(log_prob).to(log_prob.dtype), zero)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        clip_frac = masked_mean((clipped > unclipped).to(log_prob.dtype), m)
        approx_kl = masked_mean(-log_ratio, m)
    return PolicyLoss(aggregate(per_token, m, agg), clip_frac, approx_kl)


POLICY_LOSSES: dict[str, Callable[..., PolicyLoss]] = {"ppo_clip": ppo_clip_loss}
"""Policy-loss variants by config `type` (same signature as `ppo_clip_loss`)."""


# ----------------------------------------------------------------------------- KL (kl_estimators.py), value, entropy


@dataclass(frozen=True)
class ValueLoss:
    """The critic's clipped value loss and its diagnostics."""

    loss: Tensor
    """Scalar loss: ½ · masked mean of max(unclipped, clipped) squared error."""
    clip_frac: Tensor
    """Masked share of tokens where the clipped error was the larger one."""


def value_loss(
    values: Tensor, returns: Tensor, old_values: Tensor, mask: Tensor, clip_range: float,
    agg: str = "token-mean",
) -> ValueLoss:
    """veRL's clipped value loss: predictions may move at most `clip_range` from `old_values`."""
    m = mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    v = torch.where(m, values, zero)
    r = torch.where(m, returns.detach().to(values.dtype), zero)
    old = torch.where(m, old_values.detach().to(values.dtype), zero)
    clipped = old + torch.clamp(v - old, -clip_range, clip_range)
    err1 = (v - r) ** 2
    err2 = (clipped - r) ** 2
    with torch.no_grad():
        clip_frac = masked_mean((err2 > err1).to(values.dtype), m)
    return ValueLoss(0.5 * aggregate(torch.maximum(err1, err2), m, agg), clip_frac)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy of the softmax over the last dimension: logsumexp(z) − Σ softmax(z)·z."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def truncated_importance_weights(
    proximal_log_prob: Tensor, behavior_log_prob: Tensor, mask: Tensor, cap: float
) -> Tensor:
    """Per-token weights `min(exp(log π_prox − log μ), cap)` correcting off-policy samples from the
    behaviour policy μ (the rollout's weights) to the proximal policy (the learner's weights at the start
    of the step); detached, 1 outside `mask`. Multiplying the advantages by them gives decoupled PPO
    (Hilton et al. 2021; AReaL) with truncated IS (IMPALA/TIS)."""
    m = mask.bool()
    log_w = torch.where(m, proximal_log_prob.detach() - behavior_log_prob.detach(), torch.zeros_like(proximal_log_prob))
    return torch.clamp(torch.exp(log_w), max=cap)
