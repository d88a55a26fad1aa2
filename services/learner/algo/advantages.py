"""Advantage estimation on a `Batch` (which groups are trained on at all is `staleness.py`'s rule).

Estimators are looked up by the config's `algorithm.advantage` in `OUTCOME_ESTIMATORS` (GRPO, Dr. GRPO;
they need only rewards) — GAE needs the critic's values, so the trainer calls `ppo_advantages` after
its value pass. All pure (tensors and schemas in, tensors out).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from searchr1.learner.algo.batch import Batch
from searchr1.learner.algo.losses import WHITEN_EPS, gae_advantages, gae_raw, grpo_advantages, kl_penalty

OUTCOME_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
    "grpo": partial(grpo_advantages, scale_by_std=True),
    "dr_grpo": partial(grpo_advantages, scale_by_std=False),
}
"""Outcome-only estimators: (scores [B], group ids [B], eps=…) → advantages [B]."""


def outcome_advantages(batch: Batch, kind: str, eps: float = 1e-6) -> Batch:
    """Fill `batch.advantages` [B] with the named outcome estimator over the batch's groups."""
    try:
        fn = OUTCOME_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"{kind!r} is not an outcome estimator ({sorted(OUTCOME_ESTIMATORS)})") from None
    return batch.with_(advantages=fn(batch.scores, batch.group_index, eps=eps))


def ppo_token_rewards(
    batch: Batch, old_log_prob: Tensor | None, ref_log_prob: Tensor | None, kl_coef: float, kind: str
) -> Tensor:
    """Search-R1's PPO rewards: the outcome reward on the last response token minus
    `kl_coef · KL(old‖ref)` on every response token (fixed KL controller)."""
    rewards = batch.token_rewards
    if old_log_prob is None or ref_log_prob is None or kl_coef == 0:
        return rewards
    kld = kl_penalty(old_log_prob, ref_log_prob, kind) * batch.response_mask
    return rewards - kl_coef * kld


def ppo_advantages(batch: Batch, token_rewards: Tensor, values: Tensor, gamma: float, lam: float,
                   moments: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None) -> Batch:
    """GAE over the response tokens; fills `advantages` [B, L-1] (whitened) and `returns`.

    `moments(raw, mask) -> (mean, unbiased var)` lets data-parallel ranks whiten with the statistics of
    the whole step (all-reduced) instead of their own rows; None = this batch's own (veRL)."""
    if moments is None:
        adv, ret = gae_advantages(token_rewards, values, batch.response_mask, gamma, lam)
        return batch.with_(advantages=adv, returns=ret)
    raw, ret = gae_raw(token_rewards, values, batch.response_mask, gamma, lam)
    mean, var = moments(raw, batch.response_mask)
    adv = (raw - mean) * torch.rsqrt(var + WHITEN_EPS) * batch.response_mask
    return batch.with_(advantages=adv, returns=ret)
