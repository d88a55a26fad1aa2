"""KL estimators between the policy and the reference, as pure tensor functions (tensors in, tensors out):
the sampled per-token estimators chosen by name from `KL_ESTIMATORS` (veRL's `kl`, `abs`, `mse`,
`low_var_kl`, and EMA-PG's `k3plusplus`, `k4`, `k5` — Search-R1's EMA-PG release, arXiv 2602.04417 —
whose gradients, not values, differ), the top-k KL with its sampled tail correction (`topk_kl`) and the
KL importance weight π/π_old (`kl_importance_weight`).

`searchr1.learner.algo.losses` re-exports every public name here: `losses.kl_penalty`, `losses.topk_kl` and
`losses.kl_importance_weight` are the stable entry points.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

LOW_VAR_KL_CLAMP = 10.0
KL_LOG_RATIO_CLAMP = 20.0


def _kl_k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    return log_prob - ref_log_prob


def _kl_abs(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    return (log_prob - ref_log_prob).abs()


def _kl_mse(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    return 0.5 * (log_prob - ref_log_prob).square()


def _kl_low_var(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    kl = ref_log_prob - log_prob
    return torch.clamp(torch.exp(kl) - kl - 1.0, min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)


def _grad_carrier(log_prob: Tensor) -> Tensor:
    """π/sg(π) = exp(log π − sg(log π)): equals 1, and its gradient is ∇log π (the score function)."""
    return torch.exp(log_prob - log_prob.detach())


def _kl_k3_clamped(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k3 with the log-ratio clamped to ±KL_LOG_RATIO_CLAMP before `exp`, then the result to ±10."""
    kl = torch.clamp(ref_log_prob - log_prob, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(kl) - kl - 1.0, min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)


def _kl_k3_plusplus(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    return _kl_k3_clamped(log_prob, ref_log_prob) * _grad_carrier(log_prob)


def _kl_k4(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    return (log_prob - ref_log_prob).detach() * _grad_carrier(log_prob)


def _kl_k5(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    log_w = torch.clamp(ref_log_prob - log_prob, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return torch.exp(log_w.detach()) * log_w + (log_prob - log_prob.detach())


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "kl": _kl_k1,
    "k1": _kl_k1,
    "abs": _kl_abs,
    "mse": _kl_mse,
    "k2": _kl_mse,
    "low_var_kl": _kl_low_var,
    "k3": _kl_low_var,
    "k3plusplus": _kl_k3_plusplus,
    "k4": _kl_k4,
    "k5": _kl_k5,
}
"""Per-token KL estimators from a sampled token's log-probs: `kl`/`k1` = log π − log π_ref; `abs` = |k1|;
`mse`/`k2` = ½·k1²; `low_var_kl`/`k3` = exp(−k1) + k1 − 1 clamped to ±10 (Schulman's estimator, veRL's
GRPO default). EMA-PG's estimators differ from these in their gradients, not their values:
`k4` = sg(k1)·π/sg(π) (value k1; gradient sg(k1)·∇log π, the score-function gradient of KL(π‖π_ref));
`k3plusplus` = k3·π/sg(π), k3 with its log-ratio clamped to ±20 before `exp` (value k3; gradient
(1 − π_ref/π)·∇log π + k3·∇log π); `k5` = sg(w)·log w + (log π − sg(log π)) with
log w = clamp(log π_ref − log π, ±20) (value w·log w, a sampled KL(π_ref‖π); gradient (1 − w)·∇log π)."""


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate of the named `kind` (see `KL_ESTIMATORS`); same shape as the inputs."""
    try:
        fn = KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown kl_penalty kind {kind!r}; expected one of {sorted(KL_ESTIMATORS)}") from None
    return fn(log_prob, ref_log_prob)


TOPK_KL_DIRECTIONS = ("reverse", "forward")


def topk_kl(
    policy_logits_k: Tensor,
    policy_logsumexp: Tensor,
    ref_logits_k: Tensor,
    ref_logsumexp: Tensor,
    *,
    direction: str = "reverse",
    topk_ids: Tensor | None = None,
    sampled_ids: Tensor | None = None,
    log_prob: Tensor | None = None,
    ref_log_prob: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """KL between the policy and the reference over an index set I of k token ids per position, from
    logits gathered at I (`*_logits_k`, [..., k]) and log-sum-exps over the *full* vocabulary ([...]),
    so log π(v) = logit(v) − logsumexp is exact for v ∈ I. Returns per-token `(head, tail)` tensors [...].

    `reverse` (KL(π‖π_ref), I = the pre-update policy's top-k): head = Σ_{v∈I} π(v)(log π(v) − log π_ref(v)).
    `forward` (KL(π_ref‖π), I = the reference's top-k): head = Σ_{v∈I} π_ref(v)(log π_ref(v) − log π(v)).
    With I the whole vocabulary the head is the exact KL.

    Tail correction, when `topk_ids` ([..., k], the ids of I) is given: an estimate of the mass outside I
    from the sampled token y (`sampled_ids`, its log-probs `log_prob` / `ref_log_prob`), zero where y ∈ I:
    reverse → the `k4` estimator, forward → the `k5` estimator (see `KL_ESTIMATORS`). Without
    `topk_ids` the tail is zeros. The trainer multiplies only the tail by `kl_importance_weight`."""
    if direction not in TOPK_KL_DIRECTIONS:
        raise ValueError(f"unknown top-k KL direction {direction!r}; expected one of {TOPK_KL_DIRECTIONS}")
    if policy_logits_k.shape != ref_logits_k.shape:
        raise ValueError(f"policy logits {tuple(policy_logits_k.shape)} and reference logits "
                         f"{tuple(ref_logits_k.shape)} must be gathered at the same ids")
    lead = policy_logits_k.shape[:-1]
    for name, t in (("policy_logsumexp", policy_logsumexp), ("ref_logsumexp", ref_logsumexp)):
        if t.shape != lead:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(lead)}")
    logp_k = policy_logits_k - policy_logsumexp.unsqueeze(-1)
    ref_k = ref_logits_k - ref_logsumexp.unsqueeze(-1)
    if direction == "reverse":
        head = (torch.exp(logp_k) * (logp_k - ref_k)).sum(dim=-1)
    else:
        head = (torch.exp(ref_k) * (ref_k - logp_k)).sum(dim=-1)
    if topk_ids is None:
        return head, torch.zeros_like(head)
    if sampled_ids is None or log_prob is None or ref_log_prob is None:
        raise ValueError("the tail correction (topk_ids given) needs sampled_ids, log_prob and ref_log_prob")
    if topk_ids.shape != policy_logits_k.shape:
        raise ValueError(f"topk_ids has shape {tuple(topk_ids.shape)}; expected {tuple(policy_logits_k.shape)}")
    for name, t in (("sampled_ids", sampled_ids), ("log_prob", log_prob), ("ref_log_prob", ref_log_prob)):
        if t.shape != lead:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(lead)}")
    outside = ~(topk_ids == sampled_ids.unsqueeze(-1)).any(dim=-1)
    sampled = (_kl_k4 if direction == "reverse" else _kl_k5)(log_prob, ref_log_prob)
    return head, torch.where(outside, sampled, torch.zeros((), dtype=sampled.dtype, device=sampled.device))


def kl_importance_weight(
    log_prob: Tensor, old_log_prob: Tensor, clip: tuple[float | None, float | None] | None = None
) -> Tensor:
    """Detached per-token weight π/π_old = exp(clamp(log π − log π_old, ±20)) correcting the KL's sampled
    estimate for tokens drawn from π_old while π has moved (later mini-batches of a step), optionally
    clipped to `clip = (lo, hi)` (either bound may be None)."""
    log_w = torch.clamp((log_prob - old_log_prob).detach(), -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    w = torch.exp(log_w)
    if clip is not None:
        lo, hi = clip
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"importance-weight clip {clip} has lo > hi")
        w = torch.clamp(w, min=lo, max=hi)
    return w
