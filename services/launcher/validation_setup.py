"""How `searchr1 up` sets up validation during training (`validation.Validator`) from its settings and launch
plan: the base model (`[launcher.validation] base_model`, else `[rollout] model`), what stops the launch
before anything starts (`validation_problems`), the trackers the settings ask for, and the eval command and
environment (`make_validator`: the plan's `eval` template against its retriever and reward service, the
rollout workers' environment without their Redis URL and GPUs, `[launcher.validation] env` over it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.launcher.metrics import ValidationMetrics
from searchr1.launcher.settings import LauncherSettings, ValidationSettings
from searchr1.launcher.validation import Validator

if TYPE_CHECKING:
    from searchr1.launcher.specs import LaunchPlan


def base_model_of(settings: ValidationSettings, config: Path) -> Path | None:
    """The model step 0 validates and whose tokenizer every snapshot uses: `base_model`, else
    ROLLOUT_MODEL, else `[rollout] model` of the run config."""
    from searchr1.core.settings import ConfigError, read_config_file

    if settings.base_model:
        return Path(settings.base_model).resolve()
    model = os.environ.get("ROLLOUT_MODEL")
    if not model:
        try:
            table = read_config_file(config).get("rollout") or {}
        except (OSError, ConfigError):
            table = {}
        model = table.get("model") if isinstance(table, dict) else None
    return Path(model).resolve() if model else None


def validation_problems(settings: ValidationSettings, config: Path, placed: bool = False) -> list[str]:
    """What stops validation before anything starts: a missing held-out set or base model; on a placed run
    (`[placement]`), no GPU named for it (it would start its engine on a worker's)."""
    problems = []
    if placed and "CUDA_VISIBLE_DEVICES" not in settings.env:
        problems.append("validation: with [placement], name the GPU(s) it evaluates on in [launcher.validation] env "
                        "(CUDA_VISIBLE_DEVICES, and ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION when it shares one)")
    if settings.data and not Path(settings.data).is_file():
        problems.append(f"validation: held-out set {Path(settings.data).resolve()} not found ([launcher.validation] "
                        "data)")
    base = base_model_of(settings, config)
    if base is None:
        problems.append("validation: no base model (tokenizer and step 0): set [rollout] model or "
                        "[launcher.validation] base_model")
    elif not (base / "config.json").is_file():
        problems.append(f"validation: base model directory {base} not found or has no config.json")
    return problems


def trackers_for(settings: ValidationSettings, run: str, run_dir: Path) -> list[Any]:
    """The TensorBoard and W&B trackers the settings ask for (`TrackerUnavailable` when one's package is
    not installed)."""
    from searchr1.core.tracking import TensorBoardLog, WandbLog

    out: list[Any] = []
    if settings.tensorboard_dir:
        out.append(TensorBoardLog(settings.tensorboard_dir.replace("{run_dir}", str(run_dir))))
    if settings.wandb_project:
        out.append(WandbLog(settings.wandb_project, name=f"{run}-validation", group=run, mode=settings.wandb_mode,
                            dir=run_dir, config={"eval_every": settings.eval_every, "data": settings.data}))
    return out


def make_validator(settings: LauncherSettings, plan: LaunchPlan, say: Callable[[str, str], None]) -> Validator | None:
    """The validator of a `searchr1 up` plan (None when validation is off): `searchr1 eval` of the plan's
    command and template against its retriever and reward service, with the rollout workers' environment
    (`specs.eval_env`); trackers opened here (`TrackerUnavailable` when one is not installed)."""
    from searchr1.launcher.specs import DEFAULT_TEMPLATES, eval_env, render_template

    v = settings.validation
    if not v.enabled or plan.problems:  # a refused plan starts nothing
        return None
    config = Path(plan.values["config"])
    base = base_model_of(v, config)
    assert base is not None  # validation_problems refused the plan otherwise
    learner = next((spec for spec in plan.specs if spec.name == "learner"), None)
    weights = Path(learner.env.get("LEARNER_WEIGHTS__DIR", "") if learner else "") or plan.run_dir / "weights"
    template = {**DEFAULT_TEMPLATES, **settings.templates}["eval"]
    data = Path(str(v.data)).resolve()

    def command(model: Path, out: Path) -> list[str]:
        return [*plan.base_command, *render_template("eval", template, plan.values), "--model", str(model),
                "--data", str(data), "--out", str(out), "--samples", str(v.samples),
                *(["--limit", str(v.limit)] if v.limit else []), *v.args]

    env = {k: val for k, val in eval_env(plan).items() if k != "CUDA_VISIBLE_DEVICES"}  # a worker's GPUs are its own
    def export(chain: Path, version: int, model: Path) -> list[str]:
        return [*plan.base_command, "weights", "export", str(chain), "--version", str(version), "--out", str(model),
                "--base", str(base), "--force"]

    return Validator(v, run_dir=plan.run_dir, weights_dir=weights.resolve(), base_model=base, command=command,
                     export_command=export,
                     env={**env, **v.env}, say=say, metrics=ValidationMetrics.create(),
                     trackers=trackers_for(v, plan.run, plan.run_dir), metrics_host=settings.host,
                     metrics_port=plan.validation_metrics_port)
