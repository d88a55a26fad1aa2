"""Which settings class reads each table of a run config (configs/*.toml): shared by the tests that load
every config and the ones that check the paper configs."""

from __future__ import annotations

SETTINGS: dict[str, tuple[str, str]] = {
    "retriever": ("searchr1.retriever.settings", "RetrieverSettings"),
    "reward": ("searchr1.reward.settings", "RewardSettings"),
    "rollout": ("searchr1.rollout.settings", "RolloutSettings"),
    "learner": ("searchr1.learner.settings", "LearnerSettings"),
    "launcher": ("searchr1.launcher.settings", "LauncherSettings"),
    "world": ("searchr1.world.settings", "WorldSettings"),
    "placement": ("searchr1.launcher.placement", "PlacementSettings"),
}
"""Run-config table → (module, settings class)."""
