"""The guarded response to a collapse (off by default): when configured figures stay out of bounds for
`patience` consecutive steps, the learner rolls its policy (weights, optimizer, schedule) back to the
newest checkpoint saved before the streak began, cuts the learning rate by `lr_factor`, publishes the
rolled-back weights as a new version and records the event; after `max_rollbacks` rollbacks a further
streak stops the learner with a clear message.

Step and version numbers keep counting forward through a rollback (the groups trained on in between were
consumed and acked; workers only ever load newer versions). Events go to the log, the JSONL step log,
`{checkpoint.dir}/guard-events.jsonl` and the `searchr1_learner_guard_*` metrics. Single-process learners
only: a distributed learner refuses the setting.

`GuardPolicy` counts and decides (pure); `CollapseGuard` turns its verdict into a `Decision` naming the
checkpoint to roll back to (or the stop's message); the learner loop carries the decision out, with
`roll_back` for the weights and learning rate.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge
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
    """What the guard decided after a step; the loop carries it out."""

    action: Literal["continue", "rollback", "stop"]
    reasons: tuple[str, ...] = ()
    first_bad_step: int | None = None
    checkpoint: Path | None = None
    """A rollback's target: the newest healthy checkpoint (`CollapseGuard.judge`)."""
    message: str = ""
    """A stop's reason, for the log and the loop's exit."""


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
    """`GuardPolicy` over a running learner's step figures: `judge` returns what to do (continue, roll back
    to a named checkpoint, stop); the learner loop carries it out (`Learner.apply_guard`). It holds no
    learner: the checkpoint root to search, the metrics registry to count on, the events file to write."""

    def __init__(self, settings: GuardSettings, checkpoint_dir: Path, registry: CollectorRegistry) -> None:
        self.policy = GuardPolicy(settings)
        self.s = settings
        self.checkpoint_dir = Path(checkpoint_dir)
        self.events = self.checkpoint_dir / "guard-events.jsonl"
        self.rollbacks = Counter("searchr1_learner_guard_rollbacks_total",
                                 "Rollbacks to a healthy checkpoint by the collapse guard.", registry=registry)
        self.stop_gauge = Gauge("searchr1_learner_guard_stopped", "1 once the collapse guard stopped the learner.",
                                registry=registry)

    def judge(self, step: int, figures: dict[str, Any]) -> Decision:
        """The decision after `step`: a rollback names its healthy checkpoint; a rollback with none kept
        becomes a stop; a stop carries its message (logged, counted)."""
        d = self.policy.observe(step, figures)
        if d.action == "rollback":
            path = healthy_checkpoint(self.checkpoint_dir, d.first_bad_step, self.policy.unhealthy)
            if path is not None:
                return replace(d, checkpoint=path)
            d = Decision("stop", (*d.reasons, f"no checkpoint before step {d.first_bad_step} is kept "
                                              "(checkpoint.keep must exceed guard.patience + 1)"), d.first_bad_step)
        if d.action == "stop":
            d = replace(d, message=f"collapse guard: unhealthy since step {d.first_bad_step} "
                                   f"({'; '.join(d.reasons)}) after {self.policy.rollbacks} rollback(s): stopping")
            self.stop_gauge.set(1)
            log.error(d.message)
        return d

    def rolled_back(self, d: Decision, lr: float, version: int) -> dict[str, Any]:
        """Count and log a rollback the loop carried out; returns its event record."""
        assert d.checkpoint is not None
        self.rollbacks.inc()
        log.warning("collapse guard: unhealthy since step %d (%s): rolled back to %s, learning rate now %.3g",
                    d.first_bad_step, "; ".join(d.reasons), d.checkpoint.name, lr)
        return {"event": "guard_rollback", "first_bad_step": d.first_bad_step, "reasons": list(d.reasons),
                "checkpoint": d.checkpoint.name, "lr": lr, "version": version, "rollbacks": self.policy.rollbacks}

    def stop_event(self, d: Decision) -> dict[str, Any]:
        """The event record of a stop."""
        return {"event": "guard_stop", "first_bad_step": d.first_bad_step, "reasons": list(d.reasons),
                "rollbacks": self.policy.rollbacks}

    def record(self, step: int, event: dict[str, Any]) -> None:
        """Append `event` to `guard-events.jsonl`. Blocking: run it in a thread."""
        self.events.parent.mkdir(parents=True, exist_ok=True)
        with self.events.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "time": time.time(), **event}) + "\n")
