"""The pure aggregation of `searchr1 eval`: scored trajectory records in → the metrics table out, overall
and per group, separately for greedy and sampled trajectories.

Records are `searchr1.rollout.evaluate.EvalRecord`s or their JSON form (the `records` of `eval.json`,
which aggregate the same way). Which keys the table breaks down by is the caller's choice (`group_by`):
`data_source` or any key of a question's metadata (`searchr1.core.datasets.Question.group_value`); this
module knows no dataset's fields.

What this module does not do: run or score trajectories (`evaluate.py`) or render reports
(`eval_report.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

DEFAULT_GROUP_BY: tuple[str, ...] = ("data_source",)
"""Group keys when the caller names none (Search-R1 reports per `data_source`)."""

METRICS: tuple[tuple[str, str], ...] = (
    ("em", "EM"),
    ("f1", "F1"),
    ("searchr1_em", "Search-R1 EM"),
    ("format_valid", "format valid"),
    ("searches", "searches/q"),
    ("searched", "≥1 search"),
    ("turns", "turns/q"),
    ("response_tokens", "response tokens"),
)
"""Aggregated metrics (key, column title) in table order; each is a mean over trajectories."""

MISSING = "(none)"
"""Group name for a record without a value for a group key some other record has."""


class GroupedRecord(Protocol):
    """What aggregation reads from a record object: its fields, and its values of the group keys."""

    groups: Mapping[str, str | None]


def value(rec: GroupedRecord | Mapping[str, Any], key: str) -> Any:
    """A record's field or group value (None when the record has no such key)."""
    if isinstance(rec, Mapping):
        return rec.get(key)
    if key in rec.groups:
        return rec.groups[key]
    return getattr(rec, key, None)


def metrics_of(records: Sequence[GroupedRecord | Mapping[str, Any]]) -> dict[str, float]:
    """Means over the trajectories of `records` (one per question for greedy, K for sampled):
    `trajectories`, `questions`, then every `METRICS` key; `searched` is the share with ≥ 1 search,
    `answered` the share that ended with an answer."""
    n = len(records)
    out: dict[str, float] = {"trajectories": n, "questions": len({value(r, "qid") for r in records})}
    if n == 0:
        return out

    def mean(values: Iterable[float]) -> float:
        return math.fsum(values) / n

    out.update(
        em=mean(value(r, "em") for r in records),
        f1=mean(value(r, "f1") for r in records),
        searchr1_em=mean(value(r, "searchr1_em") for r in records),
        format_valid=mean(float(value(r, "format_valid") >= 0.5) for r in records),
        searches=mean(value(r, "num_searches") for r in records),
        searched=mean(float(value(r, "num_searches") >= 1) for r in records),
        turns=mean(value(r, "num_turns") for r in records),
        response_tokens=mean(value(r, "response_tokens") for r in records),
        generated_tokens=mean(value(r, "generated_tokens") for r in records),
        answered=mean(float(value(r, "finish_reason") == "answer") for r in records),
    )
    return out


def aggregate(records: Sequence[GroupedRecord | Mapping[str, Any]],
              group_by: Sequence[str] = DEFAULT_GROUP_BY) -> dict[str, Any]:
    """Records in → the metrics table out, separately per mode (greedy, sampled):
    `{mode: {"overall": metrics, "by": {group_key: {group_value: metrics}}}}`, group keys in `group_by`
    order. A group key appears when at least one record of the mode has a value for it (records without
    one go to `(none)`); groups are sorted by name."""
    out: dict[str, Any] = {}
    for mode in ("greedy", "sampled"):
        recs = [r for r in records if value(r, "mode") == mode]
        if not recs:
            continue
        by: dict[str, dict[str, dict[str, float]]] = {}
        for key in group_by:
            if all(value(r, key) is None for r in recs):
                continue
            groups: dict[str, list] = {}
            for r in recs:
                v = value(r, key)
                groups.setdefault(MISSING if v is None else str(v), []).append(r)
            by[key] = {g: metrics_of(groups[g]) for g in sorted(groups)}
        out[mode] = {"overall": metrics_of(recs), "by": by}
    return out
