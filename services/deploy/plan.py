"""What every generated deployment file of a run config shares: the run, the config's placement (checked
against its service tables), the learner's settings and its stop grace.

- `deploy_plan(config)` loads `[launcher]`, `[placement]` and `[learner]`, plans the placement
  (`searchr1.launcher.placement.plan_placement`) and refuses a service-table value the placement
  decides otherwise (`placement_conflicts`), then computes the learner's grace
  (`searchr1.learner.stop_budget`) for its FSDP ranks.
- The grace reaches the learner's supervisors as two numbers: torchrun waits `shutdown_timeout_s`
  (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, `learner_env`) between forwarding SIGTERM to the ranks and killing
  them, and the container's own supervisor (compose's `stop_grace_period`, the pod's
  `terminationGracePeriodSeconds`) waits `TORCHRUN_EXIT_S` longer, for torchrun itself to exit.

Resources per process come from the placement's `ProcessPlacement`s (GPUs today); each target maps them
in one function (`compose._place`, `k8s._workload`), where further per-process resources go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.deploy import DeployError

if TYPE_CHECKING:
    from searchr1.launcher.placement import Placement, PlacementSettings
    from searchr1.launcher.settings import LauncherSettings
    from searchr1.learner.settings import LearnerSettings
    from searchr1.learner.stop_budget import StopBudget

TORCHRUN_EXIT_S = 30
"""How much longer than torchrun's shutdown timeout its container's supervisor waits: torchrun's own exit
after its ranks'."""
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


@dataclass(frozen=True)
class DeployPlan:
    """One run config, read and checked for deployment."""

    config: Path
    source: str
    """The config as the generated files name it (as given on the command line)."""
    launch: LauncherSettings
    settings: PlacementSettings
    placed: Placement
    learner: LearnerSettings
    grace: StopBudget

    @property
    def run(self) -> str:
        return self.launch.run

    @property
    def project(self) -> str:
        """The compose project's name: the run's, lower-cased, starting `searchr1`."""
        name = re.sub(r"[^a-z0-9_-]+", "-", self.run.lower()).strip("-_") or "run"
        return name if name.startswith("searchr1") else f"searchr1-{name}"

    @property
    def shutdown_timeout_s(self) -> int:
        """torchrun's wait between SIGTERM to the ranks and SIGKILL: the learner's whole grace."""
        return self.grace.total_s

    @property
    def stop_grace_s(self) -> int:
        """The learner container's or pod's grace: torchrun's wait plus `TORCHRUN_EXIT_S`."""
        return self.shutdown_timeout_s + TORCHRUN_EXIT_S

    def learner_env(self) -> dict[str, str]:
        """What the learner's container adds to the placement's environment."""
        return {SHUTDOWN_TIMEOUT_ENV: str(self.shutdown_timeout_s)}


def deploy_plan(config: Path, *, source: str = "", step_s: float | None = None) -> DeployPlan:
    """The plan of `config`; `DeployError` naming what to change when the config cannot be deployed as
    written (a setting that does not validate, a placement that cannot run, a service table that
    contradicts it, a model whose size the grace cannot be computed for). `step_s`: a measured learner
    step time, in place of the estimate."""
    from searchr1.core.commandline import validation_message
    from searchr1.core.settings import ConfigError, load_settings, read_config_file
    from searchr1.launcher.placement import PlacementSettings, placement_conflicts, plan_placement
    from searchr1.launcher.settings import LauncherSettings
    from searchr1.learner.settings import LearnerSettings
    from searchr1.learner.stop_budget import stop_budget

    def load(cls):
        try:
            return load_settings(cls, config)
        except ConfigError:
            raise
        except ValueError as exc:  # a field that does not validate: named with its table
            raise DeployError(f"[{cls.section}] {validation_message(exc)}") from None

    try:
        launch = load(LauncherSettings)
        settings = load(PlacementSettings)
        learner = load(LearnerSettings)
        placed = plan_placement(settings)
        if not placed.places_gpus:
            raise DeployError("[placement] lists no GPUs; these files place a GPU node's processes")
        conflicts = placement_conflicts(read_config_file(config), placed)
        if conflicts:
            raise DeployError("; ".join(conflicts))
        grace = stop_budget(learner, len(placed.learner.gpus), step_s=step_s)
    except DeployError as exc:
        raise DeployError(f"{source or config}: {exc}") from None
    except (ConfigError, ValueError) as exc:  # PlacementError, StopBudgetError and pydantic's are ValueErrors
        raise DeployError(f"{source or config}: {' '.join(validation_message(exc).split())}") from None
    return DeployPlan(config, source or str(config), launch, settings, placed, learner, grace)
