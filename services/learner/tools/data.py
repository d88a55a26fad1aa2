"""Datasets of questions: Search-R1's parquet (`scripts/data_process/nq_search.py` output) or our JSONL,
read into `searchr1.core.datasets.Question`s (the dispatcher adds the run-time fields of a `Task`);
and `prepare` (parquet in, our JSONL out) behind `searchr1 data prepare`.

Search-R1 rows carry `id`, `question`, `golden_answers`, `data_source`, `prompt` ([{role, content}] with
the already-templated prompt), `ability`, `reward_model.ground_truth.target` and `extra_info {split,
index}`. We take the raw `question` (the rollout worker applies the template itself); when a file has no
`question` column we recover it from the prompt's trailing `Question: …`. Answers come from
`reward_model.ground_truth.target`, else `golden_answers`.

Our JSONL: one object per line `{"task_id"?, "question", "golden_answers", "data_source"?, "metadata"?}`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from searchr1.core.datasets import DatasetError, Question, parse_row, read_rows

__all__ = ["DatasetError", "Question", "load_tasks", "oversample", "prepare"]


def load_tasks(path: str | Path) -> list[Question]:
    """Read a `.parquet` (Search-R1) or `.jsonl` dataset. Tasks carry the raw question (rollout workers
    apply the template), so a row's templated `prompt` messages are not kept (~1 KB a question)."""
    specs = [dataclasses.replace(parse_row(r, i, default_split="train"), messages=None)
             for i, r in enumerate(read_rows(path))]
    if len({s.task_id for s in specs}) != len(specs):
        raise DatasetError(f"{path}: task ids are not unique")
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
    for s in specs:
        out.append(s)
        for k in range(2, repeats.get(s.data_source, 1) + 1):
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
