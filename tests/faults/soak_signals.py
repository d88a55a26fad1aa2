"""What the soak counts as a run saying why it stalls — a signal — for its silent-stall figure
(`soak_curves.silent_stalls`: no training step for longer than `stall_bound_s` while no signal fires):

- an alert of `deploy/prometheus/rules/searchr1.yml` that the fault makes fire, evaluated on the services'
  `/metrics` as the soak scrapes them every `sample_s`: TasksDeadLettered and StepUnfillable (the learner's
  `tasks_replaced_total` rose: firing for the rules' 15 minutes), LearnerNoProgress (`progress_age_seconds`
  past half `stall_timeout_seconds`), RolloutTasksFailing (a worker's `task_failures_total` rose: 10
  minutes), RedisRefusingWrites (a `redis_errors_total` rose: 5 minutes). The conditions are the rules'; their
  `for:` waits (minutes, sized for real runs) are left out, the soak's bound being minutes itself;
- the supervisor restarting a process (`RUN_DIR/restarts.jsonl`: from its death to it being healthy again);
- `searchr1 up` stopping with the cause (a dataset row refused), until the soak starts it again.

Waiting with green probes and no alert is what the figure catches.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

WATCHED = {
    # metric → (alert, seconds it fires after a rise of the counter)
    "searchr1_learner_tasks_replaced_total": ("TasksDeadLettered/StepUnfillable", 900.0),
    "searchr1_rollout_task_failures_total": ("RolloutTasksFailing", 600.0),
    "searchr1_learner_redis_errors_total": ("RedisRefusingWrites", 300.0),
    "searchr1_rollout_redis_errors_total": ("RedisRefusingWrites", 300.0),
}
GAUGES = ("searchr1_learner_progress_age_seconds", "searchr1_learner_stall_timeout_seconds")


def scrape(port: int, timeout_s: float = 2.0) -> dict[str, float] | None:
    """The watched counters (summed over their labels) and gauges of one metrics port; None: no answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
            text = r.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in WATCHED or sample.name in GAUGES:
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


@dataclass
class Signals:
    """The scrapes, restarts and stops of one soak, as (from, to, why) intervals in soak seconds."""

    scrapes: list[tuple[float, str, dict[str, float]]] = field(default_factory=list)
    stops: list[tuple[float, float, str]] = field(default_factory=list)
    """`searchr1 up` stopped with a cause, until it was started again."""

    def add(self, t: float, process: str, values: dict[str, float] | None) -> None:
        if values is not None:
            self.scrapes.append((t, process, values))

    def alerts(self, sample_s: float) -> list[tuple[float, float, str]]:
        """The alerts the scrapes show firing."""
        out: list[tuple[float, float, str]] = []
        last: dict[tuple[str, str], float] = {}
        for t, process, values in self.scrapes:
            for name, value in values.items():
                if name in WATCHED:
                    before = last.get((process, name))
                    if before is None:
                        rose = False  # first sight
                    elif value >= before:
                        rose = value > before
                    else:
                        rose = value > 0  # a reset (the process restarted): whatever it counted since
                    if rose:
                        alert, lasts = WATCHED[name]
                        out.append((t - sample_s, t + lasts, f"{alert} ({process})"))
                    last[(process, name)] = value
            age, bound = values.get(GAUGES[0]), values.get(GAUGES[1])
            if age is not None and bound and age > 0.5 * bound:
                out.append((t - sample_s, t, f"LearnerNoProgress ({age:.0f} s)"))
        return out

    def intervals(self, restarts_path: Path, t0: float, sample_s: float) -> list[tuple[float, float, str]]:
        """Every signal: the alerts, the supervisor's restarts (`restarts.jsonl`, wall times minus `t0`) and
        `up`'s stops."""
        out = self.alerts(sample_s) + list(self.stops)
        if restarts_path.is_file():
            for line in restarts_path.read_text().splitlines():
                r = json.loads(line)
                died = r["died_at"] - t0
                healthy = (r["healthy_at"] - t0) if r.get("healthy_at") is not None else died + sample_s
                out.append((died, max(died, healthy), f"restart of {r['name']} (exit {r['exit']})"))
        return sorted(out)
