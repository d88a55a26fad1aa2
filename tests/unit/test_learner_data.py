"""Datasets (Search-R1 parquet, our JSONL), `data prepare`, and the dispatcher's seeded epoch order."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from searchr1.cli import build_app
from searchr1.core.datasets import parse_row
from searchr1.learner.dispatcher import epoch_order
from searchr1.learner.tools.data import DatasetError, load_tasks, prepare

PROMPT = ("Answer the given question. ... For example, <answer> Beijing </answer>. "
          "Question: who wrote the iliad?\n")


def _searchr1_parquet(path, with_question=True):
    rows = [{
        "id": "train_0", "question": "who wrote the iliad", "golden_answers": ["Homer"],
        "data_source": "nq", "prompt": [{"role": "user", "content": PROMPT}], "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Homer", "homer"]}},
        "extra_info": {"split": "train", "index": 0},
    }, {
        "id": "train_1", "question": "capital of france", "golden_answers": ["Paris"],
        "data_source": "hotpotqa", "prompt": [{"role": "user", "content": "Question: capital of france?\n"}],
        "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": ["Paris"]}},
        "extra_info": {"split": "train", "index": 1},
    }]
    if not with_question:
        for r in rows:
            del r["question"], r["id"]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_searchr1_parquet_rows(tmp_path):
    _searchr1_parquet(tmp_path / "train.parquet")
    specs = load_tasks(tmp_path / "train.parquet")
    assert [s.task_id for s in specs] == ["train_0", "train_1"]
    assert specs[0].question == "who wrote the iliad"
    assert specs[0].golden_answers == ["Homer", "homer"]  # reward_model.ground_truth.target wins
    assert specs[1].data_source == "hotpotqa" and specs[0].metadata == {"ability": "fact-reasoning"}
    assert specs[0].messages is None  # the templated prompt is not kept: workers template the question


def test_question_recovered_from_prompt_when_missing(tmp_path):
    _searchr1_parquet(tmp_path / "p.parquet", with_question=False)
    specs = load_tasks(tmp_path / "p.parquet")
    assert specs[0].question == "who wrote the iliad?"
    assert specs[0].task_id == "nq-train-0"


def test_jsonl_and_prepare_round_trip(tmp_path):
    src = tmp_path / "t.parquet"
    _searchr1_parquet(src)
    out = tmp_path / "tasks.jsonl"
    r = CliRunner().invoke(build_app(), ["data", "prepare", str(src), str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"task_id": "train_0", "question": "who wrote the iliad", "golden_answers": ["Homer", "homer"],
                       "data_source": "nq", "metadata": {"ability": "fact-reasoning"}}
    assert [s.task_id for s in load_tasks(out)] == ["train_0", "train_1"]
    assert prepare(out, tmp_path / "again.jsonl") == 2


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        load_tasks(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "golden_answers": []}\nnot json\n')
    with pytest.raises(DatasetError, match="bad.jsonl:2"):
        load_tasks(bad)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"task_id": "a", "question": "q"}\n{"task_id": "a", "question": "r"}\n')
    with pytest.raises(DatasetError, match="unique"):
        load_tasks(dup)
    with pytest.raises(DatasetError, match="no 'question'"):
        parse_row({"prompt": [{"content": "nothing here"}]}, 0)


def test_epoch_order_is_seeded_and_differs_per_epoch():
    a, b = epoch_order(50, seed=3, epoch=0), epoch_order(50, seed=3, epoch=0)
    assert a == b and sorted(a) == list(range(50))
    assert epoch_order(50, seed=3, epoch=1) != a


def test_dispatcher_resumes_the_same_order():
    from searchr1.learner.dispatcher import Dispatcher
    from searchr1.learner.settings import DispatcherSettings
    from searchr1.learner.tools.data import Question

    specs = [Question(f"q{i}", f"question {i}", ["a"]) for i in range(4)]
    s = DispatcherSettings(seed=1, epochs=3, group_size=2)
    first = Dispatcher(None, specs, s)
    ids = [first._next().task_id for _ in range(10)]
    assert len(set(ids)) == 10 and ids[4].endswith("@e1")
    resumed = Dispatcher(None, specs, s, **Dispatcher(None, specs, s, epoch=1, cursor=2).position())
    assert [resumed._next().task_id for _ in range(4)] == ids[6:10]
    assert Dispatcher(None, specs, s, epoch=0, cursor=4).position() == {"epoch": 1, "cursor": 0}
    restored = Dispatcher(None, specs, s)  # built at the start, then restored from a checkpoint's position
    restored.restore({"epoch": 1, "cursor": 2}, version=7)
    assert [restored._next().task_id for _ in range(4)] == ids[6:10]


def test_source_repeats_oversample_a_data_source():
    from searchr1.learner.dispatcher import Dispatcher
    from searchr1.learner.settings import DispatcherSettings
    from searchr1.learner.tools.data import Question, oversample

    specs = [Question("k0", "known?", ["a"], "known"), Question("u0", "unknown?", ["b"], "unknown"),
             Question("u1", "unknown 2?", ["c"], "unknown")]
    out = oversample(specs, {"known": 3})
    assert [s.task_id for s in out] == ["k0", "k0~2", "k0~3", "u0", "u1"]
    assert {s.question for s in out[:3]} == {"known?"} and out[2].data_source == "known"
    assert oversample(specs, {}) == specs and oversample(specs, {"unknown": 1}) == specs
    # one epoch of the dispatcher holds every copy once, each under its own task id
    s = DispatcherSettings(seed=0, epochs=1, group_size=2, source_repeats={"known": 3})
    d = Dispatcher(None, out, s)
    ids = [d._next().task_id for _ in range(len(out))]
    assert sorted(ids) == sorted(f"{t.task_id}@e0" for t in out) and d.exhausted
    with pytest.raises(DatasetError, match="not in the dataset.*'nq'"):
        oversample(specs, {"nq": 2})
    with pytest.raises(DatasetError, match=">= 1"):
        oversample(specs, {"known": 0})
    with pytest.raises(DatasetError, match="collides"):
        oversample(specs + [Question("k0~2", "another?", ["d"], "unknown")], {"known": 2})
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        DispatcherSettings(source_repeats={"known": 0})
