"""Corrections for the train–inference mismatch beyond plain TIS, and the mismatch's per-step figures.

The engine samples token y with probability μ(y) (its behaviour log-prob); the learner computes π(y) for
the same token under the same weights. Each correction turns the per-token ratios r = π/μ of the
on-policy rows into weights that multiply the advantages (`algorithm.mismatch_correction`, registry
`CORRECTIONS`):

- `tis` — truncated IS (`tis.py`): w = min(r, `tis_cap`); with `tis_cap` unset, w = 1 (no correction).
- `seq_mask` — sequence-level masked IS (geometric rejection): a sequence whose geometric-mean ratio
  exp(mean log r over its sampled tokens) leaves [lo, hi] (`seq_mask_band`) gets weight 0 on every token;
  kept sequences get the TIS weight when `tis_cap` is set, else 1. Rejects whole trajectories a broken
  engine produced (a long tail of slightly-off tokens), which token-level truncation keeps.
- `icepop` — token-level masking (IcePop, the Ring-1T report): w = r when α ≤ r ≤ β (`icepop_band`),
  0 outside; the ratio is kept, not truncated, inside the band.

Departures from veRL's rollout correction (`rollout_rs`/`rollout_is`), each on purpose: veRL drops
rejected tokens from the loss's denominator (a rewritten response mask); here a rejected token keeps its
place in the denominator with weight 0, so the step's normalisation is computed once, before the ratios
are known (one forward less when a step makes one update) — a step that rejects a share s of its tokens
moves the policy (1 − s) as far. The KL and entropy terms still see rejected tokens (veRL's rejection
removes them from those too). Defaults follow veRL's geometric preset (band [0.999, 1.001]) and IcePop's
paper ([0.5, 5]).

Figures (`MismatchSums`, summed over micro-batches and ranks, then `figures()`): mean |Δ log p| per token,
the mean and largest |sequence log-ratio| (mean log r per sequence), the normalised effective sample size
(Σr)² / (N·Σr²) of the step's token ratios (1 = no mismatch), and the shares of tokens and sequences a
correction zeroed. Pure tensor functions: no model, no I/O; positions outside `mask` (NaN included)
change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from searchr1.learner.algo.tis import tis_weights


@dataclass(frozen=True)
class CorrectionParams:
    """A correction's knobs (from `algorithm`)."""

    tis_cap: float | None = None
    """Truncation of the token ratio (`tis`, and `seq_mask`'s kept rows); None = no truncation weight."""
    seq_band: tuple[float, float] = (0.999, 1.001)
    """`seq_mask`: geometric-mean ratios kept, [lo, hi]."""
    token_band: tuple[float, float] = (0.5, 5.0)
    """`icepop`: token ratios kept, [α, β]."""


def _log_ratio(learner_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor) -> Tensor:
    """log π − log μ on `mask` (float64), exact zeros elsewhere (garbage never leaks)."""
    m = mask.bool()
    d = learner_log_prob.detach().double() - engine_log_prob.detach().double()
    return torch.where(m, d, torch.zeros((), dtype=torch.float64, device=d.device))


def seq_log_ratio(learner_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor) -> Tensor:
    """Per sequence, the mean log-ratio over its sampled tokens = log of the geometric-mean ratio ([B],
    float64; 0 for a row without tokens)."""
    d = _log_ratio(learner_log_prob, engine_log_prob, mask)
    n = mask.bool().sum(dim=-1).clamp_min(1).to(torch.float64)
    return d.sum(dim=-1) / n


def tis_correction(learner_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor, p: CorrectionParams) -> Tensor:
    """TIS: min(r, cap) on `mask`, 1 elsewhere; all ones when `p.tis_cap` is None."""
    if p.tis_cap is None:
        return torch.ones_like(learner_log_prob, dtype=torch.float32)
    return tis_weights(learner_log_prob, engine_log_prob, mask, p.tis_cap).float()


def seq_mask_correction(learner_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor,
                        p: CorrectionParams) -> Tensor:
    """Sequence-level masked IS: rows whose geometric-mean ratio leaves `p.seq_band` get 0 on every
    position; the others keep the TIS weight (or 1)."""
    lo, hi = p.seq_band
    geo = torch.exp(seq_log_ratio(learner_log_prob, engine_log_prob, mask))
    keep = (geo >= lo) & (geo <= hi)
    base = tis_correction(learner_log_prob, engine_log_prob, mask, p)
    return torch.where(keep.unsqueeze(-1), base, torch.zeros_like(base))


def icepop_correction(learner_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor,
                      p: CorrectionParams) -> Tensor:
    """Token-level masking (IcePop): r where α ≤ r ≤ β, 0 outside the band, 1 off `mask`."""
    alpha, beta = p.token_band
    r = torch.exp(_log_ratio(learner_log_prob, engine_log_prob, mask))
    w = torch.where((r >= alpha) & (r <= beta), r, torch.zeros_like(r))
    return torch.where(mask.bool(), w, torch.ones_like(w)).float()


CORRECTIONS: dict[str, Callable[[Tensor, Tensor, Tensor, CorrectionParams], Tensor]] = {
    "tis": tis_correction,
    "seq_mask": seq_mask_correction,
    "icepop": icepop_correction,
}
"""Mismatch corrections by `algorithm.mismatch_correction`: per-token weights [B, T] (detached, 1 off the
mask) that multiply the on-policy rows' advantages."""


def correction_weights(name: str, learner_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor,
                       p: CorrectionParams) -> Tensor:
    """The named correction's weights (see `CORRECTIONS`)."""
    try:
        fn = CORRECTIONS[name]
    except KeyError:
        raise ValueError(f"unknown mismatch correction {name!r}; expected one of {sorted(CORRECTIONS)}") from None
    return fn(learner_log_prob, engine_log_prob, mask, p)


@dataclass
class MismatchSums:
    """Sums over a step's on-policy sampled tokens (addable across micro-batches, all-reducible across ranks
    field by field)."""

    tokens: float = 0.0
    abs_diff: float = 0.0
    """Σ |log π − log μ|."""
    ratio: float = 0.0
    """Σ r."""
    ratio_sq: float = 0.0
    """Σ r²."""
    zeroed_tokens: float = 0.0
    """Tokens the correction gave weight 0."""
    seqs: float = 0.0
    seq_log_ratio: float = 0.0
    """Σ over sequences of the mean log-ratio."""
    seq_abs_max: float = 0.0
    """Largest |sequence log-ratio| (summed across ranks: an upper bound of the max there)."""
    zeroed_seqs: float = 0.0
    """Sequences whose every token got weight 0."""

    def add(self, learner_log_prob: Tensor, engine_log_prob: Tensor, mask: Tensor, weights: Tensor) -> None:
        """Add one micro-batch (rows without a token in `mask` add nothing)."""
        m = mask.bool()
        rows = m.any(dim=-1)
        if not bool(rows.any()):
            return
        d = _log_ratio(learner_log_prob, engine_log_prob, m)
        r = torch.where(m, torch.exp(d.clamp(-50.0, 50.0)), torch.zeros_like(d))  # finite sums, even for a desync
        zero = m & (weights == 0)
        seq = seq_log_ratio(learner_log_prob, engine_log_prob, m)[rows]
        self.tokens += float(m.sum())
        self.abs_diff += float(d.abs().sum())
        self.ratio += float(r.sum())
        self.ratio_sq += float((r * r).sum())
        self.zeroed_tokens += float(zero.sum())
        self.seqs += float(rows.sum())
        self.seq_log_ratio += float(seq.sum())
        self.seq_abs_max = max(self.seq_abs_max, float(seq.abs().max()))
        self.zeroed_seqs += float((zero.sum(dim=-1) == m.sum(dim=-1))[rows].sum())

    def figures(self) -> dict[str, float]:
        """The step's mismatch figures ({} without a sampled token)."""
        if self.tokens == 0:
            return {}
        return {
            "mismatch_abs_logp_mean": self.abs_diff / self.tokens,
            "mismatch_seq_log_ratio_mean": self.seq_log_ratio / max(self.seqs, 1.0),
            "mismatch_seq_log_ratio_abs_max": self.seq_abs_max,
            "mismatch_ess": self.ratio ** 2 / (self.tokens * self.ratio_sq) if self.ratio_sq > 0 else 0.0,
            "mismatch_masked_token_frac": self.zeroed_tokens / self.tokens,
            "mismatch_masked_seq_frac": self.zeroed_seqs / max(self.seqs, 1.0),
        }
