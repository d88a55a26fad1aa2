"""Per-step series for the run page: from the archive summary (reward, EM, format, searches, lengths,
staleness, the text health signals) and from the learner's JSONL step log when the run has one (entropy,
KL, gradient norm). Pure apart from reading the step log."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

Series = list[tuple[int, float]]

ARCHIVE_SERIES = {
    "reward": ("reward", "mean"),
    "exact match": ("em", "mean"),
    "format valid": ("format_valid", "mean"),
    "searches / trajectory": ("num_searches", "mean"),
    "response tokens": ("response_tokens", "mean"),
    "staleness (versions)": ("staleness", "mean"),
    "malformed rate": ("malformed", "mean"),
    "repeated-query rate": ("repeated_rate", "mean"),
    "truncated rate": ("truncated", "mean"),
    "answer words": ("answer_words", "mean"),
    "think words": ("think_words", "mean"),
}
"""Plot title → (summary column, aggregation)."""

LOG_SERIES = {"entropy": "entropy", "KL": "kl_loss", "approx KL (old→new)": "approx_kl", "grad norm": "grad_norm",
              "importance ratio max (learner/engine)": "is_ratio_max",
              "importance ratio min (learner/engine)": "is_ratio_min", "non-finite figures": "nonfinite_figures"}
"""Plot title → step-log key."""

VALIDATION_SERIES = {"validation: Search-R1 EM": "searchr1_em", "validation: EM": "em",
                     "validation: cover EM": "cover_em", "validation: F1": "f1"}
"""Plot title → key of `searchr1 up`'s validation curve (RUN_DIR/validation.jsonl): greedy held-out scores
against the step they validated."""

ALARMS = {"malformed rate": 0.5, "truncated rate": 0.3, "repeated-query rate": 0.5}
"""Signals whose steps above the bound are marked on every plot."""


def derived(summary: pa.Table) -> pa.Table:
    """The summary with the per-row columns the series average: format_valid, staleness, truncated,
    repeated_rate (the per-step rate is the mean of these per-row shares)."""
    t = summary
    t = t.append_column("format_valid", pc.invert(t.column("malformed")).cast(pa.float64()))
    # step s trains with weights version s - 1: a group sampled with those weights is 0 versions stale
    lag = pc.subtract(pc.subtract(t.column("step"), 1), t.column("policy_version"))
    t = t.append_column("staleness", lag.cast(pa.float64()))
    t = t.append_column("truncated", pc.equal(t.column("finish_reason"), "length").cast(pa.float64()))
    q = t.column("queries").cast(pa.float64())
    rate = pc.if_else(pc.greater(q, 0), pc.divide(t.column("repeated_queries").cast(pa.float64()), q), 0.0)
    t = t.append_column("repeated_rate", rate)
    return t.set_column(t.schema.get_field_index("malformed"), "malformed", t.column("malformed").cast(pa.float64()))


def archive_series(summary: pa.Table) -> dict[str, Series]:
    """Per-step means of the `ARCHIVE_SERIES` columns (steps with no value in a column are left out)."""
    if summary.num_rows == 0:
        return {title: [] for title in ARCHIVE_SERIES}
    t = derived(summary)
    cols = sorted({c for c, _ in ARCHIVE_SERIES.values()})
    agg = t.group_by("step").aggregate([(c, "mean") for c in cols]).sort_by("step")
    steps = agg.column("step").to_pylist()
    out = {}
    for title, (col, how) in ARCHIVE_SERIES.items():
        values = agg.column(f"{col}_{how}").to_pylist()
        out[title] = [(s, float(v)) for s, v in zip(steps, values) if v is not None]
    return out


def log_series(records: Iterable[dict]) -> dict[str, Series]:
    """The `LOG_SERIES` from step-log records (`step` plus figures); non-finite values are left out."""
    out: dict[str, Series] = {title: [] for title in LOG_SERIES}
    for r in records:
        step = r.get("step")
        if not isinstance(step, int):
            continue
        for title, key in LOG_SERIES.items():
            v = r.get(key)
            if isinstance(v, int | float) and math.isfinite(v):
                out[title].append((step, float(v)))
    return {k: v for k, v in out.items() if v}


def validation_series(records: Iterable[dict]) -> dict[str, Series]:
    """The `VALIDATION_SERIES` from validation.jsonl records (each validated step; failed runs carry no
    scores and are left out)."""
    out: dict[str, Series] = {title: [] for title in VALIDATION_SERIES}
    for r in records:
        step = r.get("step")
        if not isinstance(step, int):
            continue
        for title, key in VALIDATION_SERIES.items():
            v = r.get(key)
            if isinstance(v, int | float) and math.isfinite(v):
                out[title].append((step, float(v)))
    return {k: sorted(v) for k, v in out.items() if v}


def find_validation(run_dir: Path) -> Path | None:
    """`searchr1 up`'s validation curve of a run: RUN_DIR/validation.jsonl (or beside the archive directory
    the viewer was pointed at)."""
    for d in (run_dir, run_dir.parent):
        if (d / "validation.jsonl").is_file():
            return d / "validation.jsonl"
    return None


def read_step_log(path: Path | None) -> list[dict]:
    """The JSONL step log's records (lines that are not JSON objects are skipped)."""
    if path is None or not path.is_file():
        return []
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict):
                out.append(r)
    return out


def find_step_log(run_dir: Path) -> Path | None:
    """The learner's step log of a run: the newest `*.jsonl` under `RUN_DIR/learner`, if any."""
    d = run_dir / "learner"
    logs = sorted(d.glob("*.jsonl"), key=lambda p: p.stat().st_mtime) if d.is_dir() else []
    return logs[-1] if logs else None


def guard_events(records: Iterable[dict]) -> list[dict]:
    """The collapse guard's events in the step log (`guard_rollback`, `guard_stop`), in order."""
    return [r for r in records if r.get("event") in ("guard_rollback", "guard_stop") and isinstance(r.get("step"), int)]


def alarm_steps(series: dict[str, Series], bounds: dict[str, float] = ALARMS) -> list[int]:
    """Steps where any signal of `bounds` is above its bound."""
    return sorted({s for title, bound in bounds.items() for s, v in series.get(title, []) if v > bound})
