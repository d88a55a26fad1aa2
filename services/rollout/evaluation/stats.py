"""The pure aggregation of `searchr1 eval`: scored trajectory records in → the metrics table out, overall
and per group, separately for greedy and sampled trajectories.

Records are `searchr1.rollout.evaluation.evaluate.EvalRecord`s or their JSON form (the `records` of `eval.json`,
which aggregate the same way). Which keys the table breaks down by is the caller's choice (`group_by`):
`data_source` or any key of a question's metadata (`searchr1.core.datasets.Question.group_value`); this
module knows no dataset's fields.

`paper_table` lays several evaluations out as Search-R1's Table 3 (a row per model, a column per test
set in the paper's order, the unweighted average), from their greedy trajectories.

What this module does not do: run or score trajectories (`evaluate.py`) or render reports
(`report.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

METRICS: tuple[tuple[str, str], ...] = (
    ("searchr1_em", "Search-R1 EM"),
    ("em", "EM"),
    ("cover_em", "cover EM"),
    ("f1", "F1"),
    ("format_valid", "format valid"),
    ("searches", "searches/q"),
    ("searched", "≥1 search"),
    ("turns", "turns/q"),
    ("response_tokens", "response tokens"),
    ("failed_searches", "failed searches"),
    ("failed_scores", "unscored"),
)
"""Aggregated metrics (key, column title) in table order: means over trajectories, the scores over the
scored ones; the last two are counts of trajectories."""

SCORE_KEYS: tuple[str, ...] = ("em", "cover_em", "f1", "searchr1_em", "format_valid")
"""Record fields the reward service fills (None when it could not score the trajectory)."""

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


def failed_search(rec: GroupedRecord | Mapping[str, Any]) -> bool:
    """The trajectory's environment failed it (a search refused, unanswered or over budget)."""
    return value(rec, "error") is not None or value(rec, "finish_reason") in ("retriever_unavailable",
                                                                             "search_budget")


def metrics_of(records: Sequence[GroupedRecord | Mapping[str, Any]]) -> dict[str, float | None]:
    """Means over the trajectories of `records` (one per question for greedy, K for sampled):
    `trajectories`, `questions`, then every `METRICS` key; `searched` is the share with ≥ 1 search,
    `answered` the share that ended with an answer. Scores are means over the scored trajectories (None
    when none was); `failed_searches` and `failed_scores` count the trajectories whose search failed and
    those the reward service could not score, `failure_rate` is the share with either."""
    n = len(records)
    out: dict[str, float | None] = {"trajectories": n, "questions": len({value(r, "qid") for r in records})}
    if n == 0:
        return out

    def mean(values: Iterable[float]) -> float:
        return math.fsum(values) / n

    scored = [r for r in records if value(r, "score_error") is None and value(r, "em") is not None]

    def score_mean(key: str, cut: float | None = None) -> float | None:
        """Mean over the scored trajectories that carry `key` (an eval.json older than a metric lacks it)."""
        values = [float(v) for v in (value(r, key) for r in scored) if v is not None]
        if not values:
            return None
        if cut is not None:
            values = [float(v >= cut) for v in values]
        return math.fsum(values) / len(values)

    failed = [failed_search(r) for r in records]
    unscored = [r not in scored for r in records]
    out.update(
        em=score_mean("em"),
        cover_em=score_mean("cover_em"),
        f1=score_mean("f1"),
        searchr1_em=score_mean("searchr1_em"),
        format_valid=score_mean("format_valid", cut=0.5),
        scored=len(scored),
        failed_searches=sum(failed),
        failed_scores=sum(unscored),
        failure_rate=sum(a or b for a, b in zip(failed, unscored)) / n,
        searches=mean(value(r, "num_searches") for r in records),
        searched=mean(float(value(r, "num_searches") >= 1) for r in records),
        turns=mean(value(r, "num_turns") for r in records),
        response_tokens=mean(value(r, "response_tokens") for r in records),
        generated_tokens=mean(value(r, "generated_tokens") for r in records),
        answered=mean(float(value(r, "finish_reason") == "answer") for r in records),
    )
    return out


def aggregate(records: Sequence[GroupedRecord | Mapping[str, Any]],
              group_by: Sequence[str]) -> dict[str, Any]:
    """Records in → the metrics table out, separately per mode (greedy, sampled):
    `{mode: {"overall": metrics, "by": {group_key: {group_value: metrics}}}}`, group keys in `group_by`
    order (`[rollout.eval] group_by`).
    A group key appears when at least one record of the mode has a value for it (records without
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


# ------------------------------------------------------------------------- Search-R1's Table 3 layout

SEARCH_R1_TEST_SETS: tuple[tuple[str, str], ...] = (
    ("nq", "NQ"), ("triviaqa", "TriviaQA"), ("popqa", "PopQA"), ("hotpotqa", "HotpotQA"),
    ("2wikimultihopqa", "2Wiki"), ("musique", "Musique"), ("bamboogle", "Bamboogle"))
"""Search-R1's seven test sets in its Table 3 order: (`data_source` as `searchr1 data fetch` writes it,
column title). The first five are its general-QA and multi-hop in-domain/out-of-domain split."""

TABLE_METRICS: tuple[str, ...] = ("searchr1_em", "em", "cover_em", "f1")
"""Metrics a table may show; the default, `searchr1_em`, is the score Search-R1's Table 3 reports."""


@dataclass(frozen=True)
class TableRow:
    """One evaluated model: its greedy score per test set, and their unweighted mean."""

    label: str
    scores: dict[str, float]
    """`data_source` → greedy mean of the metric (only the test sets this evaluation has)."""
    questions: dict[str, int]
    """`data_source` → questions evaluated."""
    average: float | None
    """Unweighted mean over the table's columns this row has (as Search-R1's "Avg."; None: none)."""
    complete: bool
    """The row has every column of the table (else its average is over fewer test sets)."""
    max_turns: int | None
    """The evaluation's `max_turns` (None: not recorded)."""
    failed: int = 0
    """Greedy trajectories whose search failed or that could not be scored (shown beside the scores)."""
    fingerprint: str | None = None
    """The evaluation's setting fingerprint id (`fingerprint.setting_fingerprint`; None: not recorded)."""


@dataclass(frozen=True)
class PaperTable:
    """Search-R1's Table 3 layout: a row per model, a column per test set, the average."""

    metric: str
    columns: tuple[tuple[str, str], ...]
    """(`data_source`, title): Search-R1's seven in its order when present, then any other source by name."""
    rows: tuple[TableRow, ...]


def paper_table(evals: Sequence[tuple[str, Mapping[str, Any]]], metric: str = "searchr1_em") -> PaperTable:
    """`(label, eval.json document)` pairs → the table of their greedy per-`data_source` scores. Raises
    ValueError for an unknown metric, or a document without greedy trajectories or a `data_source`
    breakdown (naming its label)."""
    if metric not in TABLE_METRICS:
        raise ValueError(f"metric must be one of {', '.join(TABLE_METRICS)}, got {metric!r}")
    if not evals:
        raise ValueError("no evaluations to tabulate")
    per_eval: list[tuple[str, dict[str, Mapping[str, float]], Mapping[str, Any]]] = []
    failed: dict[str, int] = {}
    for label, doc in evals:
        greedy = doc.get("summary", {}).get("greedy")
        if greedy is None:
            raise ValueError(f"{label}: no greedy trajectories (the table reports greedy decoding; "
                             "evaluate with --greedy)")
        by_source = greedy.get("by", {}).get("data_source")
        if not by_source:
            raise ValueError(f"{label}: no per-data_source breakdown (evaluate with --group-by data_source)")
        per_eval.append((label, dict(by_source), doc.get("meta", {})))
        overall = greedy.get("overall", {})
        failed[label] = int(overall.get("failed_searches") or 0) + int(overall.get("failed_scores") or 0)
    known = [ds for ds, _ in SEARCH_R1_TEST_SETS]
    present = {ds for _, by, _ in per_eval for ds in by}
    titles = dict(SEARCH_R1_TEST_SETS)
    columns = tuple((ds, titles[ds]) for ds in known if ds in present) + \
        tuple((ds, ds) for ds in sorted(present - set(known)))
    rows = []
    for label, by, meta in per_eval:
        scores = {ds: float(by[ds][metric]) for ds, _ in columns if ds in by and by[ds].get(metric) is not None}
        turns = meta.get("max_turns")
        fp = (meta.get("fingerprint") or {}).get("id")
        rows.append(TableRow(
            label=label, scores=scores, questions={ds: int(by[ds]["questions"]) for ds in scores},
            average=math.fsum(scores.values()) / len(scores) if scores else None,
            complete=len(scores) == len(columns), max_turns=turns if isinstance(turns, int) else None,
            failed=failed[label], fingerprint=str(fp) if fp else None))
    return PaperTable(metric, columns, tuple(rows))
