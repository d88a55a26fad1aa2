"""DAPO dynamic sampling in the learner loop: read until a step holds `groups_per_step` informative groups.

Owns the reading loop of the filter (what is set aside, acked, granted and counted); the rule that tells a
flat group is `dynamic_sampling.py`'s, the read and filter stages are the `Learner`'s (`service.py`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from searchr1.learner.algo.group_filters import split_flat_groups
from searchr1.learner.sources.base import StepInput

if TYPE_CHECKING:
    from searchr1.learner.service import Learner


async def sample_informative(learner: Learner, got: StepInput, stop: asyncio.Event) -> StepInput | None:
    """Dynamic sampling: set aside groups whose advantages are all zero (acked with the step, replaced
    by the dispatcher, never trained on) and read more until the step has `groups_per_step`
    informative groups. Raises after `dynamic_sampling_max_batches` reads that did not fill a step;
    None when stopped first (no partial step on shutdown, as `step_once`)."""
    a, want = learner.s.algorithm, learner.s.batch.groups_per_step
    acc, reads, flat, solved = StepInput(), 0, 0, 0
    part: StepInput = got
    while True:
        reads += 1
        split = split_flat_groups(part.groups)
        flat_ids = {id(g) for g in split.flat}
        learner.unacked.extend(e.id for e in part.entries if id(e.value) in flat_ids)
        acc.entries += [e for e in part.entries if id(e.value) not in flat_ids]
        acc.replays += part.replays
        acc.stale += part.stale
        acc.wrong_temperature += part.wrong_temperature
        acc.groups += split.informative
        flat, solved = flat + len(split.flat), solved + split.all_solved
        learner.metrics.dropped.labels("flat").inc(len(split.flat))
        learner.grant(len(split.flat))
        if len(acc.groups) >= want or await learner.data_exhausted():
            break
        if stop.is_set():
            return None
        if reads >= a.dynamic_sampling_max_batches:
            raise RuntimeError(
                f"dynamic sampling read {reads} batches and found {len(acc.groups)} of the {want} groups "
                f"with non-zero advantages a step needs ({flat} groups had equal rewards, {solved} of them "
                "all solved): the policy solves every task or none; raise dynamic_sampling_max_batches, "
                "change the data, or turn dynamic_sampling off")
        part = await learner.set_aside(await learner.read_groups(stop, want - len(acc.groups)))
    learner.filter_figures.update(flat_groups=float(flat), flat_all_solved=float(solved),
                                   flat_all_failed=float(flat - solved), sampling_reads=float(reads))
    return acc
