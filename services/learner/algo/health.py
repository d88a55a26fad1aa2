"""The collapse signals of a trained step (`searchr1.core.health`) as learner figures: logged in the JSONL
step log and exported as `searchr1_learner_<name>` gauges (the Grafana "Health" row, the health alerts).
The trainer's own signals (entropy, KL, gradient norm) are figures already; this adds how many of the
step's figures came out NaN or infinite."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from searchr1.core.health import SIGNALS, step_signals
from searchr1.core.schemas import TrajectoryGroup

EXPORTED = ("malformed_rate", "repeated_query_rate", "answer_words_mean", "think_words_mean", "truncated_rate")
"""The text signals the learner exports (searches per trajectory is `searches_per_trajectory` already)."""

HEALTH_GAUGES = {**{k: SIGNALS[k] for k in EXPORTED},
                 "nonfinite_figures": "How many of the step's trainer figures (loss, KL, entropy, grad norm …) "
                                      "were NaN or infinite."}
"""Gauge name (after `searchr1_learner_`) → help text."""


def health_figures(groups: Sequence[TrajectoryGroup], figures: Mapping[str, object]) -> dict[str, float]:
    """The `HEALTH_GAUGES` of one step: text signals over every trajectory of `groups`, and the count of
    non-finite numbers among the trainer's `figures`."""
    trajs = [t for g in groups for t in g.trajectories]
    signals = step_signals([t.response_text for t in trajs], [t.num_searches for t in trajs],
                           [t.finish_reason for t in trajs])
    out = {k: signals[k] for k in EXPORTED}
    out["nonfinite_figures"] = float(sum(1 for v in figures.values()
                                         if isinstance(v, float) and not math.isfinite(v)))
    return out
