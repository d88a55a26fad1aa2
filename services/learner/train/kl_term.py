"""The policy loss's KL term per micro-batch: which forwards run, what they keep, and the per-token KL
(the math itself is in `losses.py`; the optimisation loop, normalisation and aggregation in `trainer.py`).

Three shapes of KL, chosen by `algorithm.kl_loss_type` / `kl_topk_tokens`:

- sampled estimators (`kl`, `low_var_kl`, `k3plusplus`, `k4`, `k5`, …): the reference's log-prob of each
  sampled token (a no-grad forward); with `kl_importance_weight` the whole term is multiplied by π/π_old;
- `full_reverse` / `full_forward` over the whole vocabulary (`kl_topk_tokens = 0`): both models' [N, V]
  logits for one micro-batch, the exact KL; no tail, no importance weight (as EMA-PG's release);
- top-k (`kl_topk_tokens = k`): reverse KL over the *pre-update* policy's top k — recorded in the trainer's
  old-log-prob pre-pass when a step makes several updates, else taken from the update's own forward (the
  same weights) — or forward KL over the reference's top k; the reference's logits are gathered at
  those ids inside its forward, so nothing vocabulary-wide outlives one model call. The sampled tail
  correction (k4 / k5 on the sampled token when it falls outside the top k) is on by default and is the
  only part the importance weight multiplies.

EMA-PG's release computes the reference's gathered logits in a separate pre-pass over the whole batch;
here the reference runs inside each micro-batch of the update (its weights only change after the step's
last optimizer step, so the numbers are the same) and the pre-pass stores only the policy's top-k ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from searchr1.learner.algo.losses import kl_importance_weight, kl_penalty, topk_kl
from searchr1.learner.settings import AlgorithmSettings
from searchr1.learner.train.model import forward_kl_logits, forward_logprobs


@dataclass(frozen=True)
class PolicyForward:
    """The policy's forward over one micro-batch, with the KL term's per-token values."""

    log_prob: Tensor
    """[B, L-1] log-prob of each next token (0 off the response mask)."""
    entropy: Tensor | None
    """[B, L-1] entropy when asked for."""
    kl: Tensor | None
    """[B, L-1] per-token KL (0 off the response mask); None when there is no KL term."""


def ema_due(steps_done: int, tau: float, period: int) -> bool:
    """Whether the reference takes an EMA update after the step that brings the count to `steps_done`
    (steps 1-based: every `period`-th step, as EMA-PG's release)."""
    return tau < 1.0 and steps_done > 0 and steps_done % period == 0


class KLTerm:
    """Runs the policy forward of the update and the reference forward the KL needs, per micro-batch."""

    def __init__(self, algorithm: AlgorithmSettings, *, enabled: bool) -> None:
        self.a = algorithm
        self.enabled = enabled
        self.full = enabled and algorithm.kl_loss_type.startswith("full_")
        self.direction = algorithm.kl_loss_type.removeprefix("full_") if self.full else None
        self.k = algorithm.kl_topk_tokens if self.full else 0
        clip = algorithm.kl_iw_clip
        self.iw_clip = None if clip is None else (clip[0], clip[1])

    @property
    def prepass_topk(self) -> int:
        """k when the old-log-prob pre-pass must record the pre-update policy's top-k ids (reverse top-k)."""
        return self.k if self.direction == "reverse" else 0

    def prepass_policy(self, policy: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                       response_mask: Tensor) -> tuple[Tensor, Tensor | None]:
        """The pre-pass's old log-probs [B, L-1] and, for a reverse top-k KL, the policy's top-k ids as a
        dense [B, L-1, k] tensor (0 off the response mask). No grad."""
        with torch.no_grad():
            if not self.prepass_topk:
                return forward_logprobs(policy, input_ids, attention_mask, mask=response_mask)[0], None
            out = forward_kl_logits(policy, input_ids, attention_mask, response_mask, topk=self.k)
            dense = torch.zeros(*out.selected.shape, self.k, dtype=torch.long, device=out.ids.device)
            dense[out.selected] = out.ids
            return out.log_prob, dense

    def forward(
        self, policy: nn.Module, reference: nn.Module | None, input_ids: Tensor, attention_mask: Tensor,
        response_mask: Tensor, *, entropy: bool, old_log_prob: Tensor | None = None,
        topk_ids: Tensor | None = None,
    ) -> PolicyForward:
        """The policy's log-probs (with grad), entropy, and the KL term per token.

        `old_log_prob` ([B, L-1]; None = this forward's own, detached) feeds the importance weight;
        `topk_ids` ([B, L-1, k], from `prepass_policy`) are the pre-update policy's top k for a reverse
        top-k KL (None = take them from this forward: right when π_old is the current policy)."""
        if not self.enabled:
            logp, ent = forward_logprobs(policy, input_ids, attention_mask, entropy=entropy, mask=response_mask)
            return PolicyForward(logp, ent, None)
        if not self.full:
            logp, ent = forward_logprobs(policy, input_ids, attention_mask, entropy=entropy, mask=response_mask)
            with torch.no_grad():
                ref_lp, _ = forward_logprobs(reference, input_ids, attention_mask, mask=response_mask)
            kl = kl_penalty(logp, ref_lp, self.a.kl_loss_type)
            if self.a.kl_importance_weight:
                old = logp.detach() if old_log_prob is None else old_log_prob
                kl = kl * kl_importance_weight(logp, old, self.iw_clip)
            return PolicyForward(logp, ent, kl)
        sel = response_mask.bool()
        if self.k == 0:  # the whole vocabulary
            pol = forward_kl_logits(policy, input_ids, attention_mask, response_mask, entropy=entropy)
            with torch.no_grad():
                ref = forward_kl_logits(reference, input_ids, attention_mask, response_mask)
            head, tail = topk_kl(pol.logits, pol.logsumexp, ref.logits, ref.logsumexp, direction=self.direction)
        else:
            if self.direction == "reverse":
                ids = None if topk_ids is None else topk_ids[sel]
                pol = forward_kl_logits(policy, input_ids, attention_mask, response_mask, entropy=entropy,
                                        topk=self.k if ids is None else 0, at_ids=ids)
                with torch.no_grad():
                    ref = forward_kl_logits(reference, input_ids, attention_mask, response_mask, at_ids=pol.ids)
                ids = pol.ids
            else:
                with torch.no_grad():
                    ref = forward_kl_logits(reference, input_ids, attention_mask, response_mask, topk=self.k)
                pol = forward_kl_logits(policy, input_ids, attention_mask, response_mask, entropy=entropy,
                                        at_ids=ref.ids)
                ids = ref.ids
            tail_kw = {}
            if self.a.kl_tail_sampling:
                tail_kw = {"topk_ids": ids, "sampled_ids": input_ids[:, 1:][pol.selected],
                           "log_prob": pol.log_prob[pol.selected], "ref_log_prob": ref.log_prob[pol.selected]}
            head, tail = topk_kl(pol.logits, pol.logsumexp, ref.logits, ref.logsumexp, direction=self.direction,
                                 **tail_kw)
            if self.a.kl_importance_weight and self.a.kl_tail_sampling:
                old = pol.log_prob.detach() if old_log_prob is None else old_log_prob
                tail = tail * kl_importance_weight(pol.log_prob[pol.selected], old[pol.selected], self.iw_clip)
        zeros = torch.zeros(pol.log_prob.shape, dtype=head.dtype, device=head.device)
        return PolicyForward(pol.log_prob, pol.entropy, zeros.masked_scatter(pol.selected, head + tail))
