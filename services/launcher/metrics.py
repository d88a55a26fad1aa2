"""The launcher's own Prometheus metrics: the validation curve of a `searchr1 up` run (`validation.py`), on its
own CollectorRegistry, served when validation is on (`[launcher.validation] metrics_port`)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from searchr1.core.metrics import new_registry

SCORE_METRICS = ("searchr1_em", "em", "cover_em", "f1", "format_valid")
"""The greedy scores each validation records (eval.json's summary keys)."""


@dataclass
class ValidationMetrics:
    registry: CollectorRegistry
    score: Gauge
    step: Gauge
    failed: Gauge
    seconds: Gauge
    runs: Counter

    @classmethod
    def create(cls) -> ValidationMetrics:
        r = new_registry()
        return cls(
            registry=r,
            score=Gauge("searchr1_validation_score", "Greedy score of the latest validation on the held-out set "
                        "(metric: searchr1_em, em, cover_em, f1, format_valid).", ["metric"], registry=r),
            step=Gauge("searchr1_validation_step", "Learner step (policy version) of the latest validation.",
                       registry=r),
            failed=Gauge("searchr1_validation_failed_trajectories", "Trajectories of the latest validation whose "
                         "search failed or that could not be scored.", registry=r),
            seconds=Gauge("searchr1_validation_duration_seconds", "Wall time of the latest validation.",
                          registry=r),
            runs=Counter("searchr1_validation_runs_total", "Validations run (outcome: ok, failed).", ["outcome"],
                         registry=r),
        )
