"""Experiment trackers a run's figures also go to, when the user enables them: TensorBoard (event files in a
directory; extra `tensorboard`) and Weights & Biases (a run in a project, online or offline; extra `wandb`).
The learner logs its step figures through them, the launcher its validation curve. Both are optional
installs: asking for one that is not installed raises `TrackerUnavailable` naming the extra.

Each tracker has `log(figures, step)` (the numeric, finite figures; others are skipped) and `close()`.
Blocking (file writes, W&B's queue): async callers call them in a thread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class TrackerUnavailable(RuntimeError):
    """A tracker was asked for but its package is not installed."""


def numeric(figures: Mapping[str, Any]) -> dict[str, float]:
    """The figures a tracker can plot: finite ints and floats (not bools)."""
    return {k: float(v) for k, v in figures.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardLog:
    """Scalars into TensorBoard event files under `logdir` (`tensorboard --logdir` reads them)."""

    def __init__(self, logdir: str | Path) -> None:
        try:
            from tensorboard.summary import Writer
        except ImportError:
            raise TrackerUnavailable("TensorBoard logging needs the tensorboard package: "
                                     "pip install 'searchr1[tensorboard]'") from None
        Path(logdir).mkdir(parents=True, exist_ok=True)
        self.logdir = Path(logdir)
        self._writer = Writer(str(logdir))

    def log(self, figures: Mapping[str, Any], step: int) -> None:
        for name, value in numeric(figures).items():
            self._writer.add_scalar(name, value, int(step))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbLog:
    """A Weights & Biases run; `mode` offline keeps it on disk under `dir` (`wandb sync` uploads it)."""

    def __init__(self, project: str, *, name: str, group: str | None = None, mode: str | None = None,
                 dir: str | Path | None = None, config: Mapping[str, Any] | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise TrackerUnavailable("W&B logging needs the wandb package: pip install 'searchr1[wandb]'") from None
        if dir is not None:
            Path(dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name, group=group, mode=mode,  # type: ignore[arg-type]
                              dir=str(dir) if dir else None, config=dict(config or {}), reinit="create_new")

    def log(self, figures: Mapping[str, Any], step: int) -> None:
        self.run.log(numeric(figures), step=int(step))

    def close(self) -> None:
        self.run.finish()
