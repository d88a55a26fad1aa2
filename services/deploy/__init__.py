"""Deployment files generated from a run config (`searchr1 deploy compose|k8s CONFIG`): the compose project
that runs the config on one GPU node (`compose.py`) and the Kubernetes patch that places it
(`k8s.py`), both from one plan (`plan.py`): the config's `[placement]` (`searchr1.launcher.placement`,
the layout `searchr1 up` gives it), checked against the service tables, the learner's stop grace
(`searchr1.learner.stop_budget`) and the run's name.

This package composes services (launcher, learner, retriever) the way the CLI does: it sits above them
and none imports it. What it does not do: start anything (`searchr1 up` runs processes; compose and
Kubernetes run what this writes).
"""

from __future__ import annotations


class DeployError(ValueError):
    """A run config the generated files could not run; the message names what to change."""
