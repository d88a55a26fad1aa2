"""Question datasets, read once for every service: Search-R1's parquet rows (the output of its
`scripts/data_process/nq_search.py`) and our tasks JSONL, into one type, `Question`.

Search-R1 rows carry `id`, `question`, `golden_answers`, `data_source`, `prompt` ([{role, content}] with the
already-templated prompt), `ability`, `reward_model.ground_truth.target` and `extra_info {split, index, …}`.
Our JSONL lines are `{"task_id"?, "question", "golden_answers", "data_source"?, "metadata"?}`.

- `read_rows(path, limit)`: the raw rows of a `.parquet` (pyarrow, imported on use) or `.jsonl` file;
- `parse_row(row, index)`: one row → `Question`. The question is the raw `question` (else the
  prompt's trailing `Question: …`); gold answers come from `reward_model.ground_truth.target` (what
  Search-R1 scores against), else `golden_answers`; the id is `task_id`/`id`, else
  `{data_source}-{split}-{index}`; `metadata` is the row's `metadata` (plus `ability`), `info` merges
  `metadata` and `extra_info` as strings.

`Question` is what the learner's dispatcher turns into wire `Task`s (adding run-time fields: group size,
epoch, sampling, …) and what `searchr1 eval` evaluates; neither defines a question type of its own.
Nothing here knows a particular dataset's fields: reports break results down by `group_value(key)` for
keys their caller configures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_QUESTION_IN_PROMPT = re.compile(r"Question:\s*(.+?)\s*$", re.DOTALL)


class DatasetError(ValueError):
    """A dataset file or row that cannot be read; the message names the file/row."""


@dataclass(frozen=True)
class Question:
    """One dataset question, whatever file it came from (a wire `Task` minus run-time fields)."""

    task_id: str
    question: str
    golden_answers: list[str]
    data_source: str = "unknown"
    metadata: dict[str, str] = field(default_factory=dict)
    """The row's `metadata` as strings, plus `ability` when the row has one: travels with every `Task`
    made from the question and into prepared tasks JSONL."""
    info: dict[str, str] = field(default_factory=dict)
    """`metadata` and `extra_info` (split, index, and whatever a dataset adds) as strings, empty values
    left out: what reports group by."""
    messages: list[dict[str, str]] | None = None
    """Search-R1's `prompt` column (chat messages with the templated question), when present."""
    ability: str | None = None

    def group_value(self, key: str) -> str | None:
        """The question's value for a report group key: `data_source`, else `info[key]` (None if absent)."""
        return self.data_source if key == "data_source" else self.info.get(key)

    def to_json(self) -> dict[str, Any]:
        """The question as one line of our tasks JSONL."""
        return {"task_id": self.task_id, "question": self.question, "golden_answers": self.golden_answers,
                "data_source": self.data_source, "metadata": self.metadata}


def strings(value: Any) -> list[str]:
    """A gold-answer field as a list of strings (None → [], a string → [it], arrays → items)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in list(value)]


def parse_row(row: Mapping[str, Any], index: int, default_split: str = "train") -> Question:
    """One Search-R1 parquet row or tasks-JSONL object → `Question` (see module docstring)."""
    prompt = row.get("prompt")
    messages = None
    first_content = ""
    if prompt is not None and not isinstance(prompt, str) and len(prompt):
        if isinstance(prompt[0], Mapping):
            first_content = str(prompt[0].get("content") or "")
        if all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt):
            messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        m = _QUESTION_IN_PROMPT.search(first_content)
        if not m:
            raise DatasetError(f"row {index}: no 'question' and no 'Question: …' in prompt[0].content")
        question = m.group(1)
    elif prompt is not None and not isinstance(prompt, str) and len(prompt) and messages is None:
        raise DatasetError(f"row {index}: 'prompt' must be a list of {{role, content}} messages")
    golds: list[str] = []
    rm = row.get("reward_model")
    if isinstance(rm, Mapping) and isinstance(rm.get("ground_truth"), Mapping):
        golds = strings(rm["ground_truth"].get("target"))
    if not golds:
        golds = strings(row.get("golden_answers"))
    source = str(row.get("data_source") or "unknown")
    raw_extra = row.get("extra_info")
    extra: Mapping[str, Any] = raw_extra if isinstance(raw_extra, Mapping) else {}
    meta = row.get("metadata")
    if meta is not None and not isinstance(meta, Mapping):
        raise DatasetError(f"row {index}: 'metadata' must be an object, got {type(meta).__name__}")
    meta = meta or {}
    qid = row.get("task_id") or row.get("id")
    if not qid:
        qid = f"{source}-{extra.get('split', default_split)}-{extra.get('index', index)}"
    info = {str(k): str(v) for k, v in {**meta, **extra}.items() if v is not None and v != ""}
    ability = str(row["ability"]) if row.get("ability") else None
    metadata = {str(k): str(v) for k, v in meta.items()}
    if ability:
        metadata.setdefault("ability", ability)
    return Question(task_id=str(qid), question=str(question).strip(), golden_answers=golds, data_source=source,
                    metadata=metadata, info=info, messages=messages, ability=ability)


def read_rows(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The rows of a `.parquet` (Search-R1) or `.jsonl` file (the first `limit` when given)."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"dataset not found: {p}")
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - pyarrow comes with the learner/rollout extras
            raise DatasetError("reading parquet needs pyarrow (pip install pyarrow)") from exc
        import pyarrow as pa

        try:
            table = pq.read_table(p)
        except (OSError, pa.ArrowException) as exc:
            raise DatasetError(f"{p} is not a readable parquet file: {' '.join(str(exc).split())}") from None
        if limit is not None:
            table = table.slice(0, limit)
        return table.to_pylist()
    if p.suffix in (".jsonl", ".json"):
        rows: list[dict[str, Any]] = []
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{p} is not a readable UTF-8 JSONL file: {exc}") from None
        for n, line in enumerate(text.splitlines(), 1):
            if limit is not None and len(rows) >= limit:
                break
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{p}:{n}: not JSON: {exc}") from exc
        return rows
    raise DatasetError(f"dataset must be .parquet or .jsonl: {p}")
