"""The policy loss's KL term per micro-batch: which forwards run, what they keep, and the per-token KL
(the math itself is in `algo/losses.py`; the optimisation loop, normalisation and aggregation in `trainer.py`).

One small function per shape (`_no_kl`, `_sampled_kl`, `_full_kl`, `_topk_reverse_kl`,
`_topk_forward_kl`), chosen once at start by `kl_shape` from `algorithm.kl_loss_type` / `kl_topk_tokens`
(no KL loss: the policy's forward only):

- sampled estimators (`kl`, `low_var_kl`, `k3plusplus`, `k4`, `k5`, …): the reference's log-prob of each
  sampled token (a no-grad forward); with `kl_importance_weight` the whole term is multiplied by π/π_old;
- `full_reverse` / `full_forward` over the whole vocabulary (`kl_topk_tokens = 0`): both models' [N, V]
  logits for one micro-batch, the exact KL; no tail, no importance weight (as EMA-PG's release);
- top-k (`kl_topk_tokens = k`): reverse KL over the *pre-update* policy's top k — recorded in the trainer's
  old-log-prob pre-pass (`prepass.py`) when a step makes several updates, else taken from the update's own forward (the
  same weights) — or forward KL over the reference's top k; the reference's logits are gathered at
  those ids inside its forward, so nothing vocabulary-wide outlives one model call. The sampled tail
  correction (k4 / k5 on the sampled token when it falls outside the top k) is on by default and is the
  only part the importance weight multiplies.

EMA-PG's release computes the reference's gathered logits in a separate pre-pass over the whole batch;
here the reference runs inside each micro-batch of the update (its weights only change after the step's
last optimizer step, so the numbers are the same) and the pre-pass stores only the policy's top-k ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from searchr1.learner.algo.losses import kl_importance_weight, kl_penalty, topk_kl
from searchr1.learner.settings import AlgorithmSettings
from searchr1.learner.train.model import KLLogits, forward_kl_logits, forward_logprobs


@dataclass(frozen=True)
class PolicyForward:
    """The policy's forward over one micro-batch, with the KL term's per-token values."""

    log_prob: Tensor
    """[B, L-1] log-prob of each next token (0 off the response mask)."""
    entropy: Tensor | None
    """[B, L-1] entropy when asked for."""
    kl: Tensor | None
    """[B, L-1] per-token KL (0 off the response mask); None when there is no KL term."""


@dataclass(frozen=True)
class MicroBatch:
    """The tensors of one micro-batch a KL shape reads."""

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    entropy: bool
    """Whether the policy's entropy is wanted."""
    old_log_prob: Tensor | None = None
    """[B, L-1] π_old (None = the forward's own, detached): feeds the importance weight."""
    topk_ids: Tensor | None = None
    """[B, L-1, k] the pre-update policy's top k (reverse top-k KL; None = take them from this forward)."""


KLShape = Callable[["KLTerm", nn.Module, "nn.Module | None", MicroBatch], PolicyForward]


def _policy_logprobs(policy: nn.Module, mb: MicroBatch) -> tuple[Tensor, Tensor | None]:
    """The policy's forward for the shapes that need only sampled-token log-probs (with grad)."""
    return forward_logprobs(policy, mb.input_ids, mb.attention_mask, entropy=mb.entropy, mask=mb.response_mask)


def _no_kl(term: KLTerm, policy: nn.Module, reference: nn.Module | None, mb: MicroBatch) -> PolicyForward:
    """No KL loss: the policy's forward only."""
    logp, ent = _policy_logprobs(policy, mb)
    return PolicyForward(logp, ent, None)


def _sampled_kl(term: KLTerm, policy: nn.Module, reference: nn.Module | None, mb: MicroBatch) -> PolicyForward:
    """A sampled estimator on each sampled token, optionally times the importance weight π/π_old."""
    logp, ent = _policy_logprobs(policy, mb)
    with torch.no_grad():
        ref_lp, _ = forward_logprobs(reference, mb.input_ids, mb.attention_mask, mask=mb.response_mask)
    kl = kl_penalty(logp, ref_lp, term.a.kl_loss_type)
    if term.a.kl_importance_weight:
        old = logp.detach() if mb.old_log_prob is None else mb.old_log_prob
        kl = kl * kl_importance_weight(logp, old, term.iw_clip)
    return PolicyForward(logp, ent, kl)


def _full_kl(term: KLTerm, policy: nn.Module, reference: nn.Module | None, mb: MicroBatch) -> PolicyForward:
    """The exact KL over the whole vocabulary (both models' [N, V] logits for one micro-batch)."""
    pol = forward_kl_logits(policy, mb.input_ids, mb.attention_mask, mb.response_mask, entropy=mb.entropy)
    with torch.no_grad():
        ref = forward_kl_logits(reference, mb.input_ids, mb.attention_mask, mb.response_mask)
    head, tail = topk_kl(pol.logits, pol.logsumexp, ref.logits, ref.logsumexp, direction=term.direction)
    return _dense(pol, head + tail)


def _topk_reverse_kl(term: KLTerm, policy: nn.Module, reference: nn.Module | None,
                     mb: MicroBatch) -> PolicyForward:
    """Reverse KL over the pre-update policy's top k (the pre-pass's ids, else this forward's own)."""
    ids = None if mb.topk_ids is None else mb.topk_ids[mb.response_mask.bool()]
    pol = forward_kl_logits(policy, mb.input_ids, mb.attention_mask, mb.response_mask, entropy=mb.entropy,
                            topk=term.k if ids is None else 0, at_ids=ids)
    with torch.no_grad():
        ref = forward_kl_logits(reference, mb.input_ids, mb.attention_mask, mb.response_mask, at_ids=pol.ids)
    return _dense(pol, _topk_head_and_tail(term, pol, ref, pol.ids, mb))


def _topk_forward_kl(term: KLTerm, policy: nn.Module, reference: nn.Module | None,
                     mb: MicroBatch) -> PolicyForward:
    """Forward KL over the reference's top k."""
    with torch.no_grad():
        ref = forward_kl_logits(reference, mb.input_ids, mb.attention_mask, mb.response_mask, topk=term.k)
    pol = forward_kl_logits(policy, mb.input_ids, mb.attention_mask, mb.response_mask, entropy=mb.entropy,
                            at_ids=ref.ids)
    return _dense(pol, _topk_head_and_tail(term, pol, ref, ref.ids, mb))


def _topk_head_and_tail(term: KLTerm, pol: KLLogits, ref: KLLogits, ids: Tensor, mb: MicroBatch) -> Tensor:
    """A top-k KL's head plus its sampled tail correction (the only part the importance weight multiplies)."""
    tail_kw = {}
    if term.a.kl_tail_sampling:
        tail_kw = {"topk_ids": ids, "sampled_ids": mb.input_ids[:, 1:][pol.selected],
                   "log_prob": pol.log_prob[pol.selected], "ref_log_prob": ref.log_prob[pol.selected]}
    head, tail = topk_kl(pol.logits, pol.logsumexp, ref.logits, ref.logsumexp, direction=term.direction, **tail_kw)
    if term.a.kl_importance_weight and term.a.kl_tail_sampling:
        old = pol.log_prob.detach() if mb.old_log_prob is None else mb.old_log_prob
        tail = tail * kl_importance_weight(pol.log_prob[pol.selected], old[pol.selected], term.iw_clip)
    return head + tail


def _dense(pol: KLLogits, flat_kl: Tensor) -> PolicyForward:
    """The policy forward with the flat per-position KL scattered back to [B, L-1] (0 off the mask)."""
    zeros = torch.zeros(pol.log_prob.shape, dtype=flat_kl.dtype, device=flat_kl.device)
    return PolicyForward(pol.log_prob, pol.entropy, zeros.masked_scatter(pol.selected, flat_kl))


def kl_shape(algorithm: AlgorithmSettings, *, enabled: bool) -> KLShape:
    """The one KL shape a run uses, from `kl_loss_type` and `kl_topk_tokens`."""
    if not enabled:
        return _no_kl
    if not algorithm.kl_loss_type.startswith("full_"):
        return _sampled_kl
    if algorithm.kl_topk_tokens == 0:
        return _full_kl
    return _topk_reverse_kl if algorithm.kl_loss_type == "full_reverse" else _topk_forward_kl


class KLTerm:
    """Runs the policy forward of the update and the reference forward the KL needs, per micro-batch,
    in the one shape (`kl_shape`) chosen at start."""

    def __init__(self, algorithm: AlgorithmSettings, *, enabled: bool) -> None:
        self.a = algorithm
        self.enabled = enabled
        self.full = enabled and algorithm.kl_loss_type.startswith("full_")
        self.direction = algorithm.kl_loss_type.removeprefix("full_") if self.full else None
        self.k = algorithm.kl_topk_tokens if self.full else 0
        clip = algorithm.kl_iw_clip
        self.iw_clip = None if clip is None else (clip[0], clip[1])
        self.shape: KLShape = kl_shape(algorithm, enabled=enabled)

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

    def forward(self, policy: nn.Module, reference: nn.Module | None, mb: MicroBatch) -> PolicyForward:
        """The policy's log-probs (with grad), entropy, and the KL term per token."""
        return self.shape(self, policy, reference, mb)
