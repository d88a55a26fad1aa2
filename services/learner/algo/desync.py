"""Desync detection: which rollout worker's groups show a train–inference mismatch far beyond its peers'.

A worker that failed a reload (it still samples with old weights but stamps the new version), loaded the
wrong weights or runs another dtype produces tokens whose behaviour log-probs disagree with the learner's
far more than the engine-vs-learner noise every worker shares. Per step the learner scores the groups it
is about to train (its log-probs of their sampled tokens, one no-grad forward, `desync_screen.py`) and
sums, per worker, |log π_learner − log π_engine| over the sampled tokens (`WorkerMismatch`).

`DesyncPolicy.decide` judges those sums and returns a `DesyncDecision`; it acts on nothing — the loop sets
the flagged workers' groups aside (dead-lettered with the reason, never trained) and tells each flagged
worker to re-sync its weights. The rule, per worker w with mean |Δ log p| = m_w over at least
`min_tokens` tokens:

    flagged  ⇔  m_w > abs_threshold  and  (m_w > ratio × median of the other workers' means
                                           or no other worker contributed to the step)

`abs_threshold` is a floor below which nobody is flagged, above an fp32 pair's gap on the same weights
(~1e-5 per token) and below a reload skipped after one step at lr 2e-6 (~0.014, SmolLM2); a bf16 engine's
own gap (~0.04, docs/learner.md) is above it, which the peer `ratio` absorbs;
`ratio` makes the rule relative to the peers, so a fleet-wide shift (every worker's dtype, a new engine
version) is not blamed on one worker — that shows as the step's mismatch figures, not a desync. The figure
includes the policy lag of off-policy groups (`max_staleness > 0`), which peers of the same lag share.
Pure: numbers in, a decision out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class WorkerMismatch:
    """One worker's sums over the sampled tokens of its groups in a step."""

    tokens: int = 0
    abs_diff: float = 0.0
    """Σ |log π_learner − log π_engine|."""
    groups: int = 0

    @property
    def mean_abs(self) -> float:
        """Mean |Δ log p| per token (0 without tokens)."""
        return self.abs_diff / self.tokens if self.tokens else 0.0


@dataclass(frozen=True)
class DesyncDecision:
    """What the policy found in one step."""

    flagged: dict[str, str] = field(default_factory=dict)
    """Worker id → why it is flagged (its groups are set aside, it is told to re-sync)."""
    figures: dict[str, float] = field(default_factory=dict)
    """Worker id → its mean |Δ log p| this step (every worker that contributed)."""

    @property
    def any(self) -> bool:
        return bool(self.flagged)


@dataclass(frozen=True)
class DesyncPolicy:
    """The desync rule (see the module docstring), built from `[learner.desync]` (`from_settings`), whose
    fields declare the defaults."""

    abs_threshold: float
    """Mean |Δ log p| per token below which no worker is flagged."""
    ratio: float
    """How many times the median of the other workers' means a worker must exceed to be flagged."""
    min_tokens: int
    """Workers with fewer sampled tokens in the step are not judged (too little evidence)."""

    def __post_init__(self) -> None:
        if self.abs_threshold <= 0 or self.ratio < 1 or self.min_tokens < 1:
            raise ValueError(f"desync policy needs abs_threshold > 0, ratio >= 1, min_tokens >= 1; got "
                             f"{self.abs_threshold}, {self.ratio}, {self.min_tokens}")

    @classmethod
    def from_settings(cls, desync) -> DesyncPolicy:
        """The policy of a `DesyncSettings` section."""
        return cls(desync.abs_threshold, desync.ratio, desync.min_tokens)

    def decide(self, per_worker: Mapping[str, WorkerMismatch]) -> DesyncDecision:
        """Flag the workers whose mismatch is far beyond their peers' (or beyond the floor, alone)."""
        means = {w: m.mean_abs for w, m in per_worker.items() if m.tokens}
        flagged: dict[str, str] = {}
        for worker, m in per_worker.items():
            if m.tokens < self.min_tokens or m.mean_abs <= self.abs_threshold:
                continue
            peers = [v for w, v in means.items() if w != worker]
            if not peers:
                flagged[worker] = (f"mean |Δ log p| {m.mean_abs:.4g} over {m.tokens} tokens exceeds "
                                   f"{self.abs_threshold:g} (no peer in the step)")
                continue
            median = statistics.median(peers)
            if m.mean_abs > self.ratio * median:
                flagged[worker] = (f"mean |Δ log p| {m.mean_abs:.4g} over {m.tokens} tokens is "
                                   f"{m.mean_abs / max(median, 1e-12):.3g}× its peers' median {median:.4g} "
                                   f"(threshold {self.abs_threshold:g}, {self.ratio:g}×)")
        return DesyncDecision(flagged, means)
