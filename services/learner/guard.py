"""The guarded response to a collapse (off by default): when configured figures stay out of bounds for
`patience` consecutive steps, the learner rolls its policy (weights, optimizer, schedule) back to the
newest checkpoint saved before the streak began, cuts the learning rate by `lr_factor`, publishes the
rolled-back weights as a new version and records the event; after `max_rollbacks` rollbacks a further
streak stops the learner with a clear message.

Step and version numbers keep counting forward through a rollback (the groups trained on in between were
consumed and acked; workers only ever load newer versions). Events go to the log, the JSONL step log,
`{checkpoint.dir}/guard-events.jsonl` and the `searchr1_learner_guard_*` metrics. Single-process learners
only: a distributed learner refuses the setting.

`GuardPolicy` is the decision (pure); `CollapseGuard` applies it to a running `Learner`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prometheus_client import Counter, Gauge
from pydantic import Field

from searchr1.core.settings import Section

log = logging.getLogger("searchr1.learner.guard")
_STEP_DIR = re.compile(r"^step(\d{8})$")


class GuardSettings(Section):
    enabled: bool = False
    """Watch the step figures and roll back on a collapse (single-process learners only)."""
    above: dict[str, float] = Field(default_factory=lambda: {"malformed_rate": 0.8, "nonfinite_figures": 0.5})
    """Figure → bound: a step whose figure is above its bound (or NaN/inf) is unhealthy."""
    below: dict[str, float] = Field(default_factory=dict)
    """Figure → bound: a step whose figure is below its bound (or NaN/inf) is unhealthy (e.g. `reward_mean`)."""
    patience: int = Field(default=3, ge=1, le=1000)
    """Consecutive unhealthy steps before the guard acts."""
    lr_factor: float = Field(default=0.5, gt=0.0, lt=1.0)
    """Each rollback multiplies the learning rate (and its schedule's base) by this."""
    max_rollbacks: int = Field(default=2, ge=0, le=100)
    """Rollbacks allowed; the next collapse stops the learner."""


@dataclass(frozen=True)
class Decision:
    action: Literal["continue", "rollback", "stop"]
    reasons: tuple[str, ...] = ()
    first_bad_step: int | None = None


def breaches(figures: dict[str, Any], above: dict[str, float], below: dict[str, float]) -> list[str]:
    """The out-of-bounds figures of one step, as text (`malformed_rate 0.9 > 0.8`); absent figures pass."""
    out = []
    for bounds, op in ((above, ">"), (below, "<")):
        for key, bound in sorted(bounds.items()):
            v = figures.get(key)
            if not isinstance(v, int | float):
                continue
            if not math.isfinite(v) or (v > bound if op == ">" else v < bound):
                out.append(f"{key} {v:.4g} {op} {bound:g}")
    return out


class GuardPolicy:
    """Counts consecutive unhealthy steps and decides; pure apart from its counters."""

    def __init__(self, settings: GuardSettings) -> None:
        self.s = settings
        self.streak_start: int | None = None
        self.streak = 0
        self.rollbacks = 0
        self.unhealthy: set[int] = set()
        """Every step seen out of bounds: their checkpoints are never rolled back to."""

    def observe(self, step: int, figures: dict[str, Any]) -> Decision:
        reasons = breaches(figures, self.s.above, self.s.below)
        if not reasons:
            self.streak_start, self.streak = None, 0
            return Decision("continue")
        self.unhealthy.add(step)
        if self.streak_start is None:
            self.streak_start = step
        self.streak += 1
        if self.streak < self.s.patience:
            return Decision("continue", tuple(reasons), self.streak_start)
        first, self.streak_start, self.streak = self.streak_start, None, 0
        if self.rollbacks >= self.s.max_rollbacks:
            return Decision("stop", tuple(reasons), first)
        self.rollbacks += 1
        return Decision("rollback", tuple(reasons), first)


def healthy_checkpoint(root: Path, first_bad_step: int, unhealthy: Collection[int] = ()) -> Path | None:
    """The newest complete checkpoint (`step{n:08d}/` with its state.json) that no unhealthy step describes.

    A step's trainer figures (entropy, KL …) are measured on the weights it starts from, those of the
    previous step's checkpoint: a streak that begins at step N condemns checkpoint N − 1 too. So the
    checkpoint's step must be below `first_bad_step - 1`, and neither it nor the step after it among the
    `unhealthy` steps of earlier streaks."""
    if not root.is_dir():
        return None
    bad = set(unhealthy)
    found = [(n, p) for p in root.iterdir()
             if (m := _STEP_DIR.match(p.name)) and (p / "state.json").is_file()
             and (n := int(m.group(1))) < first_bad_step - 1 and n not in bad and n + 1 not in bad]
    return max(found)[1] if found else None


class CollapseGuard:
    """`GuardPolicy` applied to a running learner: `after_step` rolls back or sets `stopped`."""

    def __init__(self, settings: GuardSettings, learner: Any) -> None:
        if learner.info.enabled:
            raise ValueError("learner.guard needs a single-process learner (it is off for torchrun runs)")
        self.policy = GuardPolicy(settings)
        self.s = settings
        self.stopped: str | None = None
        """The reason the guard stopped the learner, once it has."""
        self.events = Path(learner.s.checkpoint.dir) / "guard-events.jsonl"
        r = learner.metrics.registry
        self.rollbacks = Counter("searchr1_learner_guard_rollbacks_total",
                                 "Rollbacks to a healthy checkpoint by the collapse guard.", registry=r)
        self.stop_gauge = Gauge("searchr1_learner_guard_stopped", "1 once the collapse guard stopped the learner.",
                                registry=r)

    async def after_step(self, learner: Any, figures: dict[str, Any]) -> None:
        d = self.policy.observe(learner.state.step, figures)
        if d.action == "continue":
            return
        path = (healthy_checkpoint(Path(learner.s.checkpoint.dir), d.first_bad_step, self.policy.unhealthy)
                if d.action == "rollback" else None)
        if d.action == "rollback" and path is None:
            d = Decision("stop", (*d.reasons, f"no checkpoint before step {d.first_bad_step} is kept "
                                              "(checkpoint.keep must exceed guard.patience + 1)"), d.first_bad_step)
        if d.action == "stop":
            self.stopped = (f"collapse guard: unhealthy since step {d.first_bad_step} ({'; '.join(d.reasons)}) "
                            f"after {self.policy.rollbacks} rollback(s): stopping")
            self.stop_gauge.set(1)
            log.error(self.stopped)
            await self._record(learner, {"event": "guard_stop", "first_bad_step": d.first_bad_step,
                                         "reasons": list(d.reasons), "rollbacks": self.policy.rollbacks})
            return
        lr = await asyncio.to_thread(self._restore, learner, path)
        learner.state.version += 1  # the rolled-back weights, announced as a new version
        await learner.publish_weights()
        self.rollbacks.inc()
        log.warning("collapse guard: unhealthy since step %d (%s): rolled back to %s, learning rate now %.3g",
                    d.first_bad_step, "; ".join(d.reasons), path.name, lr)
        await self._record(learner, {"event": "guard_rollback", "first_bad_step": d.first_bad_step,
                                     "reasons": list(d.reasons), "checkpoint": path.name, "lr": lr,
                                     "version": learner.state.version, "rollbacks": self.policy.rollbacks})

    def _restore(self, learner: Any, path: Path) -> float:
        """Load `path` into the learner's components (not its step counters) and cut the learning rate:
        the schedule's base becomes the base in force before the rollback (every earlier cut included,
        whatever the checkpoint saved) times `lr_factor`, at the checkpoint's point of the schedule."""
        components = learner.training.components
        before = {c.name: list(c.scheduler.base_lrs) for c in components
                  if c.optimizer is not None and hasattr(c.scheduler, "base_lrs")}
        learner.checkpointer.load(components, path)
        lr = 0.0
        for c in components:
            if c.optimizer is None:
                continue
            sched = c.scheduler
            if c.name in before:
                sched.base_lrs = [b * self.s.lr_factor for b in before[c.name]]
                lambdas = getattr(sched, "lr_lambdas", [lambda _: 1.0] * len(sched.base_lrs))
                for group, base, fn in zip(c.optimizer.param_groups, sched.base_lrs, lambdas):
                    group["lr"] = base * fn(sched.last_epoch)
                sched._last_lr = [g["lr"] for g in c.optimizer.param_groups]  # what the next step reports
            else:
                for group in c.optimizer.param_groups:
                    group["lr"] *= self.s.lr_factor
            lr = lr or c.optimizer.param_groups[0]["lr"]
        return lr

    async def _record(self, learner: Any, event: dict[str, Any]) -> None:
        record = {"step": learner.state.step, "time": time.time(), **event}

        def write() -> None:
            self.events.parent.mkdir(parents=True, exist_ok=True)
            with self.events.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if learner.step_log is not None:
                learner.step_log.write(learner.state.step, event)

        await asyncio.to_thread(write)
