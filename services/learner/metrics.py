"""Learner metrics on its own Prometheus registry (`searchr1_learner_…`), plus the per-run JSONL step log
(one JSON object per step with every figure) and optional wandb.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from searchr1.core.metrics import RedisMetrics, StageClock, StageCollector, new_registry
from searchr1.learner.algo.health import HEALTH_GAUGES

STAGES = ("checkpoint", "archive", "weight_publish", "optimizer", "forward_backward", "queue_wait")
"""The learner's stages, in priority order (`StageClock`): the optimizer step runs inside the training
stage (forward/backward, with the reference and old log-prob forwards) and takes its time while it runs;
`queue_wait` is waiting for groups; the rest of the loop (filtering, batching, acks, logging) is `other`."""

STEP_GAUGES = {
    "loss": "Total loss of the last step.",
    "pg_loss": "Policy-gradient part of the loss.",
    "kl_loss": "KL part (estimator value, before its coefficient).",
    "entropy": "Mean token entropy.",
    "value_loss": "Critic loss (PPO).",
    "clip_frac": "Share of loss tokens where the PPO clip was active.",
    "approx_kl": "Masked mean of old − new log-prob.",
    "grad_norm": "Global gradient norm before clipping.",
    "is_ratio_max": "Largest per-token ratio of the learner's probability to the engine's (behaviour) over the "
                    "step's loss tokens, before truncation.",
    "is_ratio_min": "Smallest per-token ratio of the learner's probability to the engine's over the step's loss "
                    "tokens.",
    "reward_mean": "Mean trajectory reward of the step.",
    "reward_std": "Std of trajectory rewards of the step.",
    "em_mean": "Mean of the `em` reward component (when present).",
    "searches_per_trajectory": "Mean valid searches per trajectory.",
    "response_length_mean": "Mean response length in tokens.",
    "staleness_mean": "Mean version lag of the step's groups.",
    "tokens_per_second": "Training tokens (prompt + response) per second of step time.",
    "lr": "Current policy learning rate.",
    "mismatch_abs_logp_mean": "Mean |log π_learner − log π_engine| over the step's on-policy sampled tokens.",
    "mismatch_seq_log_ratio_mean": "Mean over the step's sequences of their mean log-ratio π_learner/π_engine.",
    "mismatch_ess": "Normalised effective sample size (Σr)²/(N·Σr²) of the step's token ratios (1 = no mismatch).",
    "mismatch_masked_token_frac": "Share of on-policy tokens the mismatch correction gave weight 0.",
    "mismatch_masked_seq_frac": "Share of on-policy sequences the mismatch correction gave weight 0 throughout.",
    "worker_mismatch_max": "Largest per-worker mean |Δ log p| of the step's groups (desync screen).",
    "worker_mismatch_median": "Median per-worker mean |Δ log p| of the step's groups (desync screen).",
    "published_changed_frac": "Share of the published version's values whose bits differ from the previous "
                              "version's: the density of its delta (0 while the loss moves: updates are not "
                              "reaching the engine).",
    "published_bytes": "Bytes the latest version wrote for the workers: its delta, its full snapshot, or both "
                       "(every weights.delta.full_every versions); broadcast transport: the bytes on the wire.",
    **HEALTH_GAUGES,
}


class LearnerMetrics:
    """Counters and gauges of one learner process."""

    def __init__(self, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry or new_registry()
        r = self.registry
        self.steps = Counter("searchr1_learner_steps_total", "Training steps completed.", registry=r)
        self.groups = Counter("searchr1_learner_groups_total", "Groups trained on.", registry=r)
        self.dropped = Counter("searchr1_learner_groups_dropped_total",
                               "Groups not trained on, by reason (replay, stale, temperature, flat).",
                               ["reason"], registry=r)
        self.nonfinite_grad = Counter("searchr1_learner_nonfinite_grad_skips_total",
                                      "Optimizer updates skipped because the gradient norm was NaN or infinite.",
                                      registry=r)
        self.desync_flags = Counter("searchr1_learner_desync_flags_total",
                                    "Workers flagged as out of sync with the learner's weights (their groups set "
                                    "aside, a re-sync requested), one per worker and step.", registry=r)
        self.trajectories = Counter("searchr1_learner_trajectories_total", "Trajectories trained on.", registry=r)
        self.tokens = Counter("searchr1_learner_tokens_total", "Tokens (prompt + response) trained on.",
                              registry=r)
        self.tasks = Counter("searchr1_learner_tasks_dispatched_total", "Tasks published by the dispatcher.",
                             registry=r)
        self.tasks_replaced = Counter(
            "searchr1_learner_tasks_replaced_total",
            "Replacement tasks published for tasks that will never yield a group, by reason: dead_lettered (a "
            "rollout worker buried the task), group_dead_lettered (the trajectories stream buried its group), "
            "unfillable (a step waited with nothing in flight that could fill it).", ["reason"], registry=r)
        self.progress_age = Gauge("searchr1_learner_progress_age_seconds",
                                  "Seconds since the learner last made progress (a trained step, bytes of a "
                                  "checkpoint written); it stops itself past stall_timeout_s.", registry=r)
        self.stall_timeout = Gauge("searchr1_learner_stall_timeout_seconds",
                                   "The learner's stall_timeout_s: no progress for this long stops it.", registry=r)
        self.redis = RedisMetrics.on(r, "learner")
        self.version = Gauge("searchr1_learner_policy_version", "Latest published policy version.", registry=r)
        self.step_seconds = Histogram("searchr1_learner_step_seconds", "Wall time of one training step.",
                                      buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600), registry=r)
        self.gauges = {k: Gauge(f"searchr1_learner_{k}", doc, registry=r) for k, doc in STEP_GAUGES.items()}
        self.stages = StageClock(STAGES, idle="other", clock=clock)
        r.register(StageCollector("searchr1_learner_stage_seconds_total",
                                  "Wall time of the learner by stage (stages never overlap).", self.stages))
        self._stage_mark = self.stages.totals()

    def watch_progress(self, stalled_for: Callable[[], float], stall_timeout_s: float) -> None:
        """Export the learner's progress watchdog: `progress_age` reads `stalled_for()` at each scrape."""
        self.progress_age.set_function(stalled_for)
        self.stall_timeout.set(stall_timeout_s)

    def stage_seconds(self) -> dict[str, float]:
        """Seconds per stage since the last call (per step: called once per step)."""
        now = self.stages.totals()
        delta = {k: round(v - self._stage_mark.get(k, 0.0), 4) for k, v in now.items()}
        self._stage_mark = now
        return delta

    def observe_step(self, figures: dict[str, float]) -> None:
        self.steps.inc()
        for k, g in self.gauges.items():
            if k in figures:
                g.set(figures[k])
        if "step_seconds" in figures:
            self.step_seconds.observe(figures["step_seconds"])


class StepLog:
    """Appends one JSON line per step to `path`, and hands the figures to each sink (a
    `searchr1.core.tracking` tracker: TensorBoard, W&B; anything with `log(figures, step=)`). `write`
    blocks (file append, the trackers): the learner calls it in a thread."""

    def __init__(self, path: Path, *sinks: Any) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sinks = [s for s in sinks if s is not None]

    def write(self, step: int, figures: dict[str, Any]) -> None:
        record = {"step": step, "time": time.time(), **figures}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        for sink in self.sinks:
            sink.log(figures, step=step)
