"""The training step's no-grad pre-pass: `PrePass`, what the update needs computed before any weight moves.

Over this rank's rows, micro-batch by micro-batch (longest first, as the update), it records:

- `old` — π_old's log-probs, when a step makes several updates (`mini_batches > 1`) or runs PPO;
  otherwise the update's own forward gives them (the same weights, one forward less);
- `topk_ids` — the pre-update policy's top-k ids, for a reverse top-k KL (`kl_term.KLTerm.prepass_topk`);
- `ref` — the reference's log-probs, for PPO's in-reward KL;
- `values` — the critic's values, for GAE.

Rows are put back in place after each micro-batch, and every tensor is padded to the step's width, so
`rows(r, width)` slices one micro-batch's share exactly as the update's micro-batch sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor, nn

from searchr1.learner.algo.batch import Batch
from searchr1.learner.train.kl_term import KLTerm
from searchr1.learner.train.model import forward_logprobs, forward_values


@dataclass(frozen=True)
class PrePass:
    """The pre-pass's tensors over this rank's rows ([B, L-1]; `topk_ids` [B, L-1, k]); None = not needed."""

    old: Tensor | None = None
    """π_old's log-probs (None: the update's own forward, detached, stands in)."""
    topk_ids: Tensor | None = None
    """The pre-update policy's top-k ids (reverse top-k KL)."""
    ref: Tensor | None = None
    """The reference's log-probs (PPO's in-reward KL)."""
    values: Tensor | None = None
    """The critic's values (PPO)."""

    def rows(self, rows: list[int], width: int) -> PrePass:
        """The share of micro-batch `rows`, trimmed to its `width` columns."""
        return replace(self, **{f.name: None if (t := getattr(self, f.name)) is None else t[rows, :width]
                                for f in fields(self)})


@dataclass(frozen=True)
class PrePassModels:
    """The models the pre-pass runs, and which of its outputs are wanted."""

    policy: nn.Module
    kl_term: KLTerm
    reference: nn.Module | None
    critic: nn.Module | None
    want_old: bool
    want_ref: bool
    want_values: bool


def _pad_to(t: Tensor, width: int) -> Tensor:
    """Right-pad dimension 1 of `t` ([B, W, ...]) to `width`."""
    return torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1]))


def _micro_outputs(m: PrePassModels, mb: Batch) -> dict[str, Tensor]:
    """The pre-pass's tensors for one micro-batch."""
    ids, attn, resp = mb.input_ids, mb.attention_mask, mb.response_mask
    out: dict[str, Tensor] = {}
    if m.want_old:
        out["old"], topk_ids = m.kl_term.prepass_policy(m.policy, ids, attn, resp)
        if topk_ids is not None:
            out["topk_ids"] = topk_ids
    if m.want_ref:
        out["ref"] = forward_logprobs(m.reference, ids, attn, mask=resp)[0]
    if m.want_values:
        out["values"] = forward_values(m.critic, ids, attn)
    return out


@torch.no_grad()
def run_prepass(m: PrePassModels, local: Batch, micro_batches: list[list[int]],
                dummy: Batch, device: torch.device) -> PrePass:
    """No-grad log-probs under the current (old) policy, the reference and the critic over `local`'s rows,
    in `micro_batches` (row lists covering every row of `local`; an empty one runs on `dummy` only to keep
    the ranks' collectives in step)."""
    width = local.loss_mask.shape[1]
    result: dict[str, Tensor] = {}
    for key, on in (("old", m.want_old), ("ref", m.want_ref), ("values", m.want_values)):
        if on:
            result[key] = torch.zeros(local.size, width, device=device)
    if m.want_old and m.kl_term.prepass_topk:
        result["topk_ids"] = torch.zeros(local.size, width, m.kl_term.prepass_topk, dtype=torch.long,
                                         device=device)
    for rows in micro_batches:
        out = _micro_outputs(m, local.select(rows) if rows else dummy)
        if rows:  # micro-batches are length-sorted: put rows back in place
            index = torch.as_tensor(rows, dtype=torch.long, device=device)
            for k, v in out.items():
                result[k][index] = _pad_to(v, width).to(result[k].dtype)
    return PrePass(**result)
