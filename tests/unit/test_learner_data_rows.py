"""Dataset rows are validated at load against the wire `Task` the dispatcher makes of them at any epoch:
a question over 16,384 characters, a task id that would pass 256 characters with its epoch suffix (or an
oversampled copy's `~k`), more than 1,024 answers, whitespace in a task id, a duplicate id — each stops
the load with the file, the row (counted from 0) and the field; rows at every bound load, and the
dispatcher makes their tasks at the largest epoch the check allows for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchr1.learner.dispatcher import Dispatcher
from searchr1.learner.settings import DispatcherSettings
from searchr1.learner.tools.data import DatasetError, load_tasks, oversample


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(i: int, **change) -> dict:
    return {"task_id": f"q{i}", "question": f"question {i}?", "golden_answers": ["a"], "data_source": "nq", **change}


@pytest.mark.parametrize(("bad", "message"), [
    (dict(question="x" * 16_385), "question: String should have at most 16384 characters"),
    (dict(task_id="t" * 245), "task id of 245 characters: at most 244 leave room for the dispatcher's epoch suffix"),
    (dict(golden_answers=["a"] * 1_025), "golden_answers: List should have at most 1024 items"),
    (dict(task_id="two words"), "task id 'two words' has whitespace or control characters"),
    (dict(data_source="s" * 129), "data_source: String should have at most 128 characters"),
])
def test_a_row_the_wire_refuses_stops_the_load_naming_the_row_and_field(tmp_path, bad, message):
    path = _write(tmp_path / "tasks.jsonl", [_row(0), _row(1), _row(2, **bad), _row(3)])
    with pytest.raises(DatasetError) as refused:
        load_tasks(path)
    assert str(refused.value).startswith(f"{path}: row 2 (task id ")
    assert message in str(refused.value)
    assert len(str(refused.value)) < 400  # the offending value is not echoed whole


def test_a_duplicate_task_id_names_both_rows(tmp_path):
    path = _write(tmp_path / "tasks.jsonl", [_row(0), _row(1), _row(2, task_id="q0")])
    with pytest.raises(DatasetError, match=r"row 2: task id 'q0' is also row 0's"):
        load_tasks(path)


def test_rows_at_every_bound_load_and_are_dispatched_at_the_largest_epoch(tmp_path):
    edge = _row(0, task_id="t" * 244, question="x" * 16_384, golden_answers=["a"] * 1_024)
    specs = load_tasks(_write(tmp_path / "tasks.jsonl", [edge, _row(1)]))
    d = Dispatcher(None, specs, DispatcherSettings(seed=0, group_size=2))  # type: ignore[arg-type]
    d.restore({"epoch": 10**10 - 1, "cursor": 0}, version=0)
    tasks = [d._next(), d._next()]
    assert max(len(t.task_id) for t in tasks) == 256


def test_an_oversampled_copy_whose_id_would_pass_the_bound_is_named(tmp_path):
    specs = load_tasks(_write(tmp_path / "tasks.jsonl", [_row(0), _row(1, task_id="t" * 243, data_source="hq")]))
    with pytest.raises(DatasetError, match=r"source repeats: task 1's copy 9 .*at most 242 leave room .* and `~9`"):
        oversample(specs, {"hq": 9})  # `~9` and the epoch suffix: 243 + 2 + 12 > 256
    fits = load_tasks(_write(tmp_path / "fits.jsonl", [_row(0), _row(1, task_id="t" * 242, data_source="hq")]))
    assert len(oversample(fits, {"hq": 9})) == 10
