"""Dataset rows parsed once for the learner and `searchr1 eval` (Search-R1 parquet rows, our JSONL)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from searchr1.core.datasets import DatasetError, parse_row, read_rows
from searchr1.core.protocol import make_prompt

SEARCH_R1_ROW = {
    "id": "test_7", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"], "data_source": "nq",
    "prompt": [{"role": "user", "content": make_prompt("who wrote hamlet")}], "ability": "fact-reasoning",
    "reward_model": {"style": "rule", "ground_truth": {"target": ["William Shakespeare", "Shakespeare"]}},
    "extra_info": {"split": "test", "index": 7, "question_type": "author"},
}


def test_search_r1_row():
    r = parse_row(SEARCH_R1_ROW, 0)
    assert (r.task_id, r.question, r.data_source, r.ability) == ("test_7", "who wrote hamlet", "nq", "fact-reasoning")
    assert r.golden_answers == ["William Shakespeare", "Shakespeare"]  # what Search-R1 scores against
    assert r.info == {"split": "test", "index": "7", "question_type": "author"}
    assert r.metadata == {"ability": "fact-reasoning"}  # what travels with the task: not extra_info
    assert (r.group_value("data_source"), r.group_value("question_type"), r.group_value("nope")) == \
        ("nq", "author", None)
    assert r.messages[0]["role"] == "user"


def test_fallbacks():
    row = {k: v for k, v in SEARCH_R1_ROW.items() if k not in ("question", "id", "reward_model")}
    r = parse_row(row, 3)
    assert r.question == "who wrote hamlet?"  # recovered from the templated prompt
    assert r.golden_answers == ["Shakespeare"] and r.task_id == "nq-test-7"
    ours = parse_row({"task_id": "t", "question": " q ", "golden_answers": "a", "metadata": {"k": 1}}, 0)
    assert (ours.task_id, ours.question, ours.golden_answers, ours.info) == ("t", "q", ["a"], {"k": "1"})
    assert ours.to_json() == {"task_id": "t", "question": "q", "golden_answers": ["a"], "data_source": "unknown",
                              "metadata": {"k": "1"}}
    assert parse_row({"question": "q"}, 5, default_split="test").task_id == "unknown-test-5"


def test_bad_rows():
    with pytest.raises(DatasetError, match="no 'question'"):
        parse_row({"prompt": [{"content": "nothing"}]}, 0)
    with pytest.raises(DatasetError, match="role, content"):
        parse_row({"question": "q", "prompt": [{"content": "x"}]}, 0)
    with pytest.raises(DatasetError, match="row 2: 'metadata' must be an object"):
        parse_row({"question": "q", "metadata": ["k"]}, 2)


def test_read_rows(tmp_path):
    pq.write_table(pa.Table.from_pylist([SEARCH_R1_ROW, {**SEARCH_R1_ROW, "id": "test_8"}]), tmp_path / "t.parquet")
    assert [r["id"] for r in read_rows(tmp_path / "t.parquet")] == ["test_7", "test_8"]
    assert len(read_rows(tmp_path / "t.parquet", limit=1)) == 1
    (tmp_path / "t.jsonl").write_text(json.dumps({"question": "a"}) + "\n\n" + json.dumps({"question": "b"}) + "\n")
    assert [r["question"] for r in read_rows(tmp_path / "t.jsonl")] == ["a", "b"]
    (tmp_path / "bad.jsonl").write_text("{}\nnot json\n")
    with pytest.raises(DatasetError, match="bad.jsonl:2"):
        read_rows(tmp_path / "bad.jsonl")
    with pytest.raises(DatasetError, match="not found"):
        read_rows(tmp_path / "missing.parquet")
    (tmp_path / "x.csv").write_text("q\n")
    with pytest.raises(DatasetError, match=".parquet or .jsonl"):
        read_rows(tmp_path / "x.csv")
