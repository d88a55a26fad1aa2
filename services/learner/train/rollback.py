"""The mechanics of a rollback the collapse guard decided (`learner/guard.py`): load a checkpoint's
weights, optimizer and schedule into the running components and cut the learning rate."""

from __future__ import annotations

from pathlib import Path

from searchr1.learner.train.checkpoint import Checkpointer, Component


def roll_back(components: list[Component], checkpointer: Checkpointer, path: Path, lr_factor: float) -> float:
    """Load `path` into `components` (not the step counters) and cut the learning rate: the schedule's base
    becomes the base in force before the rollback (every earlier cut included, whatever the checkpoint
    saved) times `lr_factor`, at the checkpoint's point of the schedule. Returns the learning rate now.
    Blocking: run it in a thread."""
    before = {c.name: list(c.scheduler.base_lrs) for c in components
              if c.optimizer is not None and hasattr(c.scheduler, "base_lrs")}
    checkpointer.load(components, path)
    lr = 0.0
    for c in components:
        if c.optimizer is None:
            continue
        sched = c.scheduler
        if c.name in before:
            sched.base_lrs = [b * lr_factor for b in before[c.name]]
            lambdas = getattr(sched, "lr_lambdas", [lambda _: 1.0] * len(sched.base_lrs))
            for group, base, fn in zip(c.optimizer.param_groups, sched.base_lrs, lambdas):
                group["lr"] = base * fn(sched.last_epoch)
            sched._last_lr = [g["lr"] for g in c.optimizer.param_groups]  # what the next step reports
        else:
            for group in c.optimizer.param_groups:
                group["lr"] *= lr_factor
        lr = lr or c.optimizer.param_groups[0]["lr"]
    return lr
