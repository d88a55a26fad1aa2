"""Training from a trajectory archive instead of the trajectories stream: `run_replay`.

The archive's groups (`archive.py`; a step archived twice is taken once, from its latest part) are rebuilt
step by step in order and fed through the learner's own train → checkpoint → publish stages, so a replayed
run computes the same losses as a live one would on those groups. No Redis, no dispatcher, no rollout.
A replay resumed from a checkpoint skips the archive steps whose task ids the checkpoint already holds.
A replay writes no archive of its own. Single process (no torchrun).

Search-R1 has no equivalent: its trainer samples and trains in one loop.
"""

from __future__ import annotations

import asyncio
import logging
import os

from searchr1.learner.archive import groups_by_step, latest_copies, read
from searchr1.learner.checkpoint import Checkpointer, TrainState
from searchr1.learner.metrics import LearnerMetrics, StepLog
from searchr1.learner.model import DistInfo
from searchr1.learner.publisher import WeightPublisher
from searchr1.learner.service import Learner, build_training
from searchr1.learner.settings import LearnerSettings

log = logging.getLogger("searchr1.learner.replay")


async def run_replay(settings: LearnerSettings, stop: asyncio.Event | None = None,
                     max_steps: int | None = None) -> TrainState:
    """Train on `settings.archive.replay_from` until its last step, `max_steps` (default
    `optim.total_steps`) or `stop`."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("replay from an archive runs in one process: start it without torchrun")
    source = settings.archive.replay_from
    if source is None:
        raise ValueError("archive.replay_from is not set")
    from searchr1.core.servers import install_shutdown_signals

    stop = stop or asyncio.Event()
    install_shutdown_signals(stop)
    limit = max_steps if max_steps is not None else settings.optim.total_steps
    table = await asyncio.to_thread(lambda: latest_copies(read(source)))
    steps = await asyncio.to_thread(groups_by_step, table)
    info = DistInfo()
    training = await asyncio.to_thread(build_training, settings, info)
    learner = Learner(settings, training, Checkpointer(settings.checkpoint.dir, settings.checkpoint.keep, info),
                      WeightPublisher(settings.weights.dir, keep=settings.weights.keep), LearnerMetrics(),
                      StepLog(settings.log_dir / f"{settings.redis.run}.jsonl"), info=info)
    state = await learner.start()
    log.info("replaying %d archived steps from %s", len(steps), source)
    for archived_step, groups in steps:
        if state.step >= limit or stop.is_set() or (learner.guard is not None and learner.guard.stopped):
            break
        if all(g.task.task_id in state.consumed for g in groups):
            continue  # trained before this replay resumed
        await learner._train_and_commit(groups, [])
        log.info("replayed archived step %d as step %d", archived_step, state.step)
    return state
