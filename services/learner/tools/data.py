"""Datasets of questions: Search-R1's parquet (`scripts/data_process/nq_search.py` output) or our JSONL,
read into `searchr1.core.datasets.Question`s (the dispatcher adds the run-time fields of a `Task`);
and `prepare` (parquet in, our JSONL out) behind `searchr1 data prepare`.

Search-R1 rows carry `id`, `question`, `golden_answers`, `data_source`, `prompt` ([{role, content}] with
the already-templated prompt), `ability`, `reward_model.ground_truth.target` and `extra_info {split,
index}`. We take the raw `question` (the rollout worker applies the template itself); when a file has no
`question` column we recover it from the prompt's trailing `Question: …`. Answers come from
`reward_model.ground_truth.target`, else `golden_answers`.

Our JSONL: one object per line `{"task_id"?, "question", "golden_answers", "data_source"?, "metadata"?}`.

Every row is validated at load against the wire `Task` the dispatcher will make of it at any epoch — its
task id with the longest epoch suffix (`{id}@e{epoch}`, epochs below 10¹⁰), its question, answers, source
and metadata — so a row the wire would refuse stops the start with its row number and the field, instead
of stopping the dispatcher the first time that row comes up, a whole epoch into the run.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pydantic import ValidationError

from searchr1.core.datasets import DatasetError, Question, parse_row, read_rows
from searchr1.core.schemas import Task

__all__ = ["DatasetError", "Question", "check_question", "load_tasks", "oversample", "prepare"]

LONGEST_EPOCH_SUFFIX = "@e" + "9" * 10
"""The longest suffix the dispatcher appends to a dataset task id (`{id}@e{epoch}`) in a run of fewer
than 10¹⁰ epochs: a row's id must leave room for it within the wire's 256 characters."""


def check_question(q: Question, where: str, *, copy_suffix: str = "") -> None:
    """Raise `DatasetError` naming `where` (a row) and each field when the wire `Task` the dispatcher makes
    of `q` at any epoch would be refused; `copy_suffix` is an oversampled copy's (`~k`)."""
    try:
        Task(task_id=f"{q.task_id}{copy_suffix}{LONGEST_EPOCH_SUFFIX}", question=q.question,
             golden_answers=q.golden_answers, data_source=q.data_source, metadata=q.metadata)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            field = ".".join(str(part) for part in e["loc"]) or "row"
            if field == "task_id" and e["type"] == "string_too_long":
                most = 256 - len(LONGEST_EPOCH_SUFFIX) - len(copy_suffix)
                problems.append(f"task id of {len(q.task_id)} characters: at most {most} leave room for the "
                                f"dispatcher's epoch suffix `@e<epoch>`" + (f" and `{copy_suffix}`" if copy_suffix
                                                                            else ""))
            elif field == "task_id" and e["type"] == "string_pattern_mismatch":
                problems.append(f"task id {q.task_id[:80]!r} has whitespace or control characters")
            else:
                problems.append(f"{field}: {e['msg']}")
        raise DatasetError(f"{where} (task id {q.task_id[:80]!r}): {'; '.join(problems)}") from None


def load_tasks(path: str | Path) -> list[Question]:
    """Read a `.parquet` (Search-R1) or `.jsonl` dataset, every row checked against the wire `Task`
    (`check_question`; errors name the row, counted from 0 among the file's rows). Tasks carry the raw
    question (rollout workers apply the template), so a row's templated `prompt` messages are not kept
    (~1 KB a question)."""
    specs = []
    first_row: dict[str, int] = {}
    for i, r in enumerate(read_rows(path)):
        q = dataclasses.replace(parse_row(r, i, default_split="train"), messages=None)
        check_question(q, f"{path}: row {i}")
        if q.task_id in first_row:
            raise DatasetError(f"{path}: row {i}: task id {q.task_id[:80]!r} is also row {first_row[q.task_id]}'s "
                               "(task ids must be unique)")
        first_row[q.task_id] = i
        specs.append(q)
    return specs


def oversample(specs: list[Question], repeats: dict[str, int]) -> list[Question]:
    """Each question of a `data_source` named in `repeats` appears that many times per epoch (a data mix,
    as when Search-R1 weights NQ against HotpotQA). Copy k ≥ 2 gets task id `{id}~k`, so the learner's
    replay check (task ids per epoch) still sees every copy as its own task; order is left to the
    dispatcher's shuffle. Unknown sources and factors below 1 are errors, not silent no-ops."""
    sources = {s.data_source for s in specs}
    unknown = sorted(set(repeats) - sources)
    if unknown:
        raise DatasetError(f"source repeats name data sources not in the dataset: {unknown} "
                           f"(it has {sorted(sources)})")
    bad = {k: v for k, v in repeats.items() if not isinstance(v, int) or v < 1}
    if bad:
        raise DatasetError(f"source repeats must be integers >= 1, got {bad}")
    out: list[Question] = []
    for i, s in enumerate(specs):
        out.append(s)
        copies = repeats.get(s.data_source, 1)
        if copies > 1:
            check_question(s, f"source repeats: task {i}'s copy {copies}", copy_suffix=f"~{copies}")
        for k in range(2, copies + 1):
            out.append(dataclasses.replace(s, task_id=f"{s.task_id}~{k}"))
    if len({s.task_id for s in out}) != len(out):
        raise DatasetError("source repeats: a copy's task id `{id}~k` collides with a dataset task id")
    return out


def prepare(src: str | Path, dst: str | Path) -> int:
    """Convert a Search-R1 parquet (or JSONL) into our tasks JSONL; returns the row count."""
    specs = load_tasks(src)
    out = Path(dst)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for s in specs:
            f.write(json.dumps(s.to_json(), ensure_ascii=False) + "\n")
    return len(specs)
