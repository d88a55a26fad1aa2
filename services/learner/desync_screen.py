"""The desync screen's guard action (the rule is `algo/desync.py`; the per-worker mismatch is
`train/screen.py`'s): before a step trains, score each worker's groups against the weights the step
starts from, and carry out the decision — a flagged worker's groups are set aside (dead-lettered with
the reason, never trained) and the worker is told to re-sync its weights (`searchr1.weightsync.request_resync`, through the
Redis link: an outage is waited out). The learner loop (`service.py`) runs it on every rank; only rank 0
dead-letters and asks for re-syncs.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from typing import Any

from searchr1.core.metrics import in_stage
from searchr1.core.schemas import TrajectoryGroup
from searchr1.learner.algo.desync import DesyncDecision, DesyncPolicy
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.settings import BatchSettings
from searchr1.learner.sources.base import GroupSource, StepGroups
from searchr1.learner.train.build import Training
from searchr1.learner.train.model import DistInfo
from searchr1.learner.train.screen import worker_mismatch
from searchr1.streams import RedisLink, StreamKeys
from searchr1.weightsync import request_resync

log = logging.getLogger("searchr1.learner")


def _stages(screen: DesyncScreen):
    """The learner's stage clock (`metrics.STAGES`): the screen's forward counts as `forward_backward`."""
    return getattr(screen.metrics, "stages", None)


class DesyncScreen:
    """Judges each step's groups by worker with `policy` and sets aside those of flagged workers."""

    def __init__(self, policy: DesyncPolicy, training: Training, batch: BatchSettings, metrics: LearnerMetrics,
                 *, info: DistInfo, run: str, source: GroupSource | None = None, redis: Any = None,
                 link: RedisLink | None = None) -> None:
        self.policy = policy
        self.training = training
        self.batch = batch
        self.metrics = metrics
        self.info = info
        self.keys = StreamKeys(run)
        self.source = source
        self.redis = redis
        self.link = link

    @in_stage("forward_backward", _stages)
    def score_workers(self, groups: list[TrajectoryGroup]):
        """Per worker, the mismatch of its groups against the weights this step starts from (every rank)."""
        b, trainer = self.batch, self.training.trainer
        return worker_mismatch(trainer.policy, groups, pad_id=self.training.pad_id, max_seq_len=b.max_seq_len,
                               micro_batch_size=b.micro_batch_size, device=trainer.device, info=self.info)

    async def screen(self, step: StepGroups) -> StepGroups:
        """Judge each worker's groups and carry out the decision. Returns the step's remaining groups,
        with the screen's figures."""
        decision: DesyncDecision = self.policy.decide(await asyncio.to_thread(self.score_workers, step.groups))
        means = list(decision.figures.values()) or [0.0]
        figures = {**step.figures, "desync_flagged_workers": float(len(decision.flagged)),
                   "worker_mismatch_max": max(means), "worker_mismatch_median": statistics.median(means)}
        keep = [i for i, g in enumerate(step.groups) if g.worker_id not in decision.flagged]
        if self.info.is_main and decision.any:
            await self.carry_out(decision, step, keep)
        return StepGroups([step.groups[i] for i in keep],
                          [step.entry_ids[i] for i in keep] if step.entry_ids else [], figures)

    async def carry_out(self, decision: DesyncDecision, step: StepGroups, keep: list[int]) -> None:
        """Rank 0: dead-letter the flagged workers' groups and ask each flagged worker to re-sync."""
        kept = set(keep)
        for i, g in enumerate(step.groups):
            if i in kept:
                continue
            reason = f"desync: worker {g.worker_id}: {decision.flagged[g.worker_id]}"
            log.error("setting aside group of task %s (version %d): %s", g.task.task_id, g.policy_version, reason)
            if self.source is not None and step.entry_ids and step.entry_ids[i]:
                await self.source.reject(step.entry_ids[i], reason)
        for worker, why in decision.flagged.items():
            self.metrics.desync_flags.inc()
            log.error("worker %s is out of sync with the learner's weights (%s): re-sync requested", worker, why)
            if self.redis is not None:
                await self.request_resync(worker, why)

    async def request_resync(self, worker: str, why: str) -> None:
        """Tell `worker` to reload the announced weights (through the Redis link: waits out an outage)."""

        def call():
            return request_resync(self.redis, self.keys, worker, why)

        await (self.link.call(call, "resync") if self.link is not None else call())
