"""A measured run's own stage clocks as the simulator's inputs, and the check that the simulator predicts
the run's wall time from them (`searchr1 plan check`).

Where the clocks land: the learner writes its stage seconds per step into its JSONL step log
(`RUN_DIR/learner/<run>.jsonl`, `stage_seconds`, with the step's trained `tokens`); the rollout workers'
stage clocks and counters are on their `/metrics` only (`searchr1_rollout_stage_seconds_total`, tokens,
turns, searches, search latency and reload histograms), which `benchmarks/system.py` scrapes every 2 s into
its `records.json` beside a copy of the step log. A record is one variant's run: its config
(`RUN_DIR/config.yaml`) gives the pipeline's shape, its clocks give the stages' costs:

- the learner: forward/backward + optimizer seconds per trained token (the run's total over its total
  tokens), the median of its other per-step work (checkpoint, archive, batching) and of the weight publish;
- each worker's engine: generation seconds per generated token, as a constant-throughput engine (on CPU
  the engine's tokens per second do not grow with the sequences sharing it), prefill included;
- a search's latency, a reload's, scoring and publishing per group, generated tokens, turns and searches
  per trajectory.

What the check shows: given each stage's cost as measured, whether the pipeline's rules (pacing,
staleness, reloads, waiting) reproduce the run's wall time; costs measured under one regime's contention
are that regime's, so each run is predicted from its own clocks.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.simulator.engine import Engine, Linear
from searchr1.simulator.pipeline import Pipeline, Result, Times, simulate
from searchr1.simulator.workload import Workload

TOLERANCE = 0.15
"""The simulator's prediction of a measured wall time must be within this share of it."""


class CalibrationError(ValueError):
    """A record that lacks what the simulator needs (the message says what)."""


@dataclass(frozen=True)
class Measured:
    name: str
    pipeline: Pipeline
    times: Times
    workload: Workload
    steps: int
    wall_s: float
    """Measured: from the run's start (learner and a worker up) to its last step."""
    learner_busy: float
    rollout_busy: float
    load: float | None
    s_per_generated_token: float
    s_per_trained_token: float


def _window(rec: dict[str, Any]) -> tuple[list[dict], dict, dict]:
    steps = rec.get("steps") or []
    t_up = rec.get("t_up")
    if not steps or t_up is None:
        raise CalibrationError(f"{rec['variant']['name']}: no step was trained (see its up.log)")
    t_end = steps[-1]["time"]
    inside = [s for s in rec.get("scrapes", []) if s["t"] <= t_end + 1.0]
    if len(inside) < 2:
        raise CalibrationError(f"{rec['variant']['name']}: fewer than two scrapes of /metrics in its window")
    if not inside[-1].get("counters"):
        raise CalibrationError(f"{rec['variant']['name']}: its record has no rollout counters (taken before they "
                               "were scraped): rerun benchmarks/system.py")
    return steps, inside[0], inside[-1]


def _delta(first: dict, last: dict, proc: str, key: str, field: str = "counters") -> float:
    return last[field].get(proc, {}).get(key, 0.0) - first[field].get(proc, {}).get(key, 0.0)


def _config(run_dir: Path) -> tuple[Any, Any]:
    from searchr1.core.settings import load_settings
    from searchr1.learner.settings import LearnerSettings
    from searchr1.rollout.settings import RolloutSettings

    cfg = run_dir / "config.yaml"
    if not cfg.is_file():
        raise CalibrationError(f"{cfg} is missing: the record's run directory must be on this machine")
    return load_settings(LearnerSettings, cfg), load_settings(RolloutSettings, cfg)


def measured(rec: dict[str, Any], length_cv: float = 0.5) -> Measured:
    """The simulator's inputs from one record of `benchmarks/system.py`'s records.json; `length_cv`: the
    spread of tokens per turn (not in the counters)."""
    name = rec["variant"]["name"]
    steps, first, last = _window(rec)
    lr, ro = _config(Path(rec["run_dir"]))
    workers = [p for p in last["stages"] if p != "learner"]
    stage = {s: statistics.fmean(_delta(first, last, w, s, "stages") for w in workers)
             for s in ("generation", "search_wait", "scoring", "publish", "weight_reload", "queue_wait")}
    c = {k: sum(_delta(first, last, w, k) for w in workers) for k in (
        "searchr1_rollout_search_latency_seconds_sum", "searchr1_rollout_search_latency_seconds_count",
        "searchr1_rollout_searches_sum", "searchr1_rollout_turns_count", "searchr1_rollout_groups_total",
        "searchr1_rollout_weight_reload_seconds_sum", "searchr1_rollout_weight_reload_seconds_count")}
    tokens = last["generated_tokens"] - first["generated_tokens"]
    trajectories = c["searchr1_rollout_turns_count"]
    if tokens <= 0 or trajectories <= 0:
        raise CalibrationError(f"{name}: no generation in its window")
    per_worker_tokens = tokens / len(workers)
    s_gen = stage["generation"] / per_worker_tokens
    fwd = [s["stage_seconds"].get("forward_backward", 0.0) + s["stage_seconds"].get("optimizer", 0.0) for s in steps]
    trained = sum(s.get("tokens", 0.0) for s in steps)
    s_train = sum(fwd) / trained
    overhead = statistics.median(sum(s["stage_seconds"].get(k, 0.0) for k in ("checkpoint", "archive", "other"))
                                 for s in steps)
    publish = statistics.median(s["stage_seconds"].get("weight_publish", 0.0) for s in steps)
    searches = c["searchr1_rollout_searches_sum"] / trajectories
    search_s = (c["searchr1_rollout_search_latency_seconds_sum"] / c["searchr1_rollout_search_latency_seconds_count"]
                if c["searchr1_rollout_search_latency_seconds_count"] else 0.0)
    reload_s = (c["searchr1_rollout_weight_reload_seconds_sum"] / c["searchr1_rollout_weight_reload_seconds_count"]
                if c["searchr1_rollout_weight_reload_seconds_count"] else 0.0)
    groups = c["searchr1_rollout_groups_total"] / len(workers)
    group_s = (stage["scoring"] + stage["publish"]) / groups if groups else 0.0
    generated = tokens / trajectories
    per_traj_trained = trained / len(steps) / (lr.batch.groups_per_step * lr.dispatcher.group_size)
    w = Workload(prompt_tokens=max(0.0, per_traj_trained - generated), generated_tokens=generated,
                 searches=min(searches, ro.agent.max_turns), obs_tokens=0.0, max_turns=ro.agent.max_turns,
                 max_tokens_per_turn=ro.agent.max_tokens_per_turn, length_cv=length_cv)
    t = Times(engine=lambda: Engine(Linear(0.0, s_gen), 0.0, ro.engine.max_num_seqs),
              train_s=lambda n: n * s_train, overhead_s=overhead, publish_s=publish, reload_s=reload_s,
              search_s=search_s, group_s=group_s)
    p = Pipeline(len(workers), lr.batch.groups_per_step, lr.dispatcher.group_size, lr.algorithm.max_staleness,
                 ro.tasks.max_concurrent, ro.weights.poll_interval_s)
    lb = sum(sum(v for k, v in s["stage_seconds"].items() if k != "queue_wait") for s in steps)
    wall = steps[-1]["time"] - rec["t_up"]
    loads = [v for t_, v in rec.get("load", []) if rec["t_up"] <= t_ <= steps[-1]["time"]]
    return Measured(name, p, t, w, len(steps), wall, lb / wall,
                    1.0 - stage["queue_wait"] / max(1e-9, sum(stage.values())),
                    statistics.fmean(loads) if loads else None, s_gen, s_train)


@dataclass(frozen=True)
class Check:
    measured: Measured
    predicted: Result

    @property
    def error(self) -> float:
        return self.predicted.wall_s / self.measured.wall_s - 1.0

    @property
    def ok(self) -> bool:
        return abs(self.error) <= TOLERANCE


def check_record(rec: dict[str, Any], seeds: int = 3, length_cv: float = 0.5) -> Check:
    """Predict one record's wall time from its own clocks (of `seeds` draws of its workload, the one
    nearest their mean)."""
    m = measured(rec, length_cv)
    runs = [simulate(m.pipeline, m.times, m.workload, m.steps, seed) for seed in range(seeds)]
    mean = min(runs, key=lambda r: abs(r.wall_s - statistics.fmean(x.wall_s for x in runs)))
    return Check(m, mean)


def records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(label, record) of every run in a records.json (or a directory holding one)."""
    f = path / "records.json" if path.is_dir() else path
    if not f.is_file():
        raise CalibrationError(f"no records.json at {path}: `benchmarks/system.py` writes one per invocation "
                               "(the rollout's stage clocks are on /metrics only; it scrapes them)")
    saved = json.loads(f.read_text())
    runs = saved.get("runs") or [saved["records"]]
    return [(f"run {i + 1} {rec['variant']['name']}", rec) for i, run in enumerate(runs) for rec in run]
