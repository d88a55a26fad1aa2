"""Groups that pass the wire schema and would still poison a training step: a token id outside the
policy's vocabulary (an index error in the embedding), a NaN or infinite reward (NaN advantages for the
whole group), a NaN or infinite behaviour log-prob (NaN importance weights, even under a zero loss
mask: inf × 0 is NaN). The stream source dead-letters such a group alone, with this reason, and trains
its batch-mates; a NaN that gets through anyway is caught at the optimizer (`train/trainer.py` skips an
update whose gradient norm is not finite).
"""

from __future__ import annotations

import math

from searchr1.core.schemas import TrajectoryGroup


def group_problem(group: TrajectoryGroup, vocab_size: int | None) -> str | None:
    """Why `group` cannot be trained on safely, or None. `vocab_size` None: token ids are only checked
    to be non-negative."""
    limit = vocab_size if vocab_size is not None else math.inf
    for i, t in enumerate(group.trajectories):
        if not math.isfinite(t.reward):
            return f"trajectory {i}: reward {t.reward}"
        for ids in (t.prompt_ids, t.response_ids):
            if ids and (min(ids) < 0 or max(ids) >= limit):
                bad = next(x for x in ids if x < 0 or x >= limit)
                return f"trajectory {i}: token id {bad} outside the vocabulary [0, {vocab_size})"
        if not all(math.isfinite(x) for x in t.behavior_logprobs):
            bad_lp = next(x for x in t.behavior_logprobs if not math.isfinite(x))
            return f"trajectory {i}: behaviour log-prob {bad_lp}"
    return None
