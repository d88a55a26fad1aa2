"""Every table of a run config checked before `searchr1 up` starts anything (and by `up --dry-run`): each
service's table through that service's own settings class, exactly as the service will load it (the file,
then its environment variables), so a typo in `[rollout.agent]` or a value out of bounds in `[learner.optim]`
is refused up front instead of ending the run after Redis, the retriever and the index build have started.

The settings classes are named here by module path and loaded with importlib, as `searchr1.cli` loads each
service's commands: the launcher runs the services as processes and imports none of their code statically
(the import contracts say so); their settings modules import only pydantic and `searchr1.core`.

A top-level table no service reads is reported as a note, not a problem: run configs may carry tables for
other tools (`[soak]` for the soak harness).
"""

from __future__ import annotations

import importlib
from pathlib import Path

SERVICE_TABLES: dict[str, str] = {
    "retriever": "searchr1.retriever.settings:RetrieverSettings",
    "index": "searchr1.retriever.build_settings:IndexBuildSettings",
    "reward": "searchr1.reward.settings:RewardSettings",
    "rollout": "searchr1.rollout.settings:RolloutSettings",
    "learner": "searchr1.learner.settings:LearnerSettings",
    "viewer": "searchr1.viewer.settings:ViewerSettings",
    "world": "searchr1.world.settings:WorldSettings",
}
"""Run-config table → the settings class that reads it."""

LAUNCHER_TABLES = ("launcher", "placement")
"""Tables the launcher itself reads (checked where it loads them)."""


def table_problems(config: str | Path) -> tuple[list[str], list[str]]:
    """(problems, notes) of the run config's service tables: a table its settings class refuses is a
    problem naming the table and the field; a top-level table nobody reads is a note."""
    from searchr1.core.commandline import validation_message
    from searchr1.core.settings import ConfigError, load_settings, read_config_file

    try:
        data = read_config_file(config)
    except (OSError, ConfigError):
        return [], []  # the launcher's own loading reports an unreadable config
    problems: list[str] = []
    notes: list[str] = []
    for table in data:
        target = SERVICE_TABLES.get(table)
        if target is None:
            if table not in LAUNCHER_TABLES:
                notes.append(f"[{table}] is read by no searchr1 service (they read: "
                             f"{', '.join(sorted([*SERVICE_TABLES, *LAUNCHER_TABLES]))})")
            continue
        module, _, name = target.partition(":")
        cls = getattr(importlib.import_module(module), name)
        try:
            load_settings(cls, config)
        except (ConfigError, ValueError) as exc:
            problems.append(f"[{table}] {validation_message(exc)}")
    return problems, notes
