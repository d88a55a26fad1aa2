"""Groups that pass the wire schema and would still poison a training step: a token id outside the
policy's vocabulary (an index error in the embedding), a NaN or infinite reward (NaN advantages for the
whole group), a NaN or infinite behaviour log-prob (NaN importance weights, even under a zero loss
mask: inf × 0 is NaN), a reward or log-prob past the range the learner trains in (`TRAINED_MAGNITUDE`:
float32 would not hold it), and — whatever the cause — a group the batch builder refuses on its own
(`batch_problem`). The stream source dead-letters such a group alone, with this reason, and trains its
batch-mates; a NaN that gets through anyway is caught at the optimizer (`train/trainer.py` skips an update
whose gradient norm is not finite).

The schema refuses the same ranges (`core/schemas.py`); the screen checks them again for groups written
by an older release, and the trial build catches what no rule names yet, so that one group cannot crash a
step — and, through restarts, take its batch-mates to the dead stream with it.
"""

from __future__ import annotations

import math

from searchr1.core.schemas import TRAINED_MAGNITUDE, TrajectoryGroup
from searchr1.learner.algo.batch import build_batch


def group_problem(group: TrajectoryGroup, vocab_size: int | None) -> str | None:
    """Why `group` cannot be trained on safely, or None. `vocab_size` None: token ids are only checked
    to be non-negative."""
    limit = vocab_size if vocab_size is not None else math.inf
    for i, t in enumerate(group.trajectories):
        if not math.isfinite(t.reward):
            return f"trajectory {i}: reward {t.reward}"
        if abs(t.reward) > TRAINED_MAGNITUDE:
            return f"trajectory {i}: reward {t.reward} (trained in float32: at most {TRAINED_MAGNITUDE:g} in magnitude)"
        for ids in (t.prompt_ids, t.response_ids):
            if ids and (min(ids) < 0 or max(ids) >= limit):
                bad = next(x for x in ids if x < 0 or x >= limit)
                return f"trajectory {i}: token id {bad} outside the vocabulary [0, {vocab_size})"
        if not all(math.isfinite(x) and abs(x) <= TRAINED_MAGNITUDE for x in t.behavior_logprobs):
            bad_lp = next(x for x in t.behavior_logprobs if not (math.isfinite(x) and abs(x) <= TRAINED_MAGNITUDE))
            return f"trajectory {i}: behaviour log-prob {bad_lp}"
    return None


def batch_problem(group: TrajectoryGroup, *, max_seq_len: int | None = None) -> str | None:
    """Why the batch builder refuses `group` on its own (None: it builds): the error of a trial build of
    the group alone, so a group that would crash a step's batch is dead-lettered alone and named."""
    try:
        build_batch([group], max_seq_len=max_seq_len)
    except Exception as exc:  # noqa: BLE001 - whatever the builder refuses, the group is the cause
        return f"the batch builder refuses it: {type(exc).__name__}: {exc}"
    return None
