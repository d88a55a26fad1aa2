"""`searchr1 data fetch` on a tiny FlashRAG-style dataset repository on disk (the hub's layout: a README
with one config per source, `<source>/<split>.jsonl`), loaded through the same `datasets` calls with a
local path and the hub offline. Each output row is checked against Search-R1's format rules, written
out here independently of `searchr1.core.protocol`; then the learner's loader and `data prepare` read
the parquet back."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from searchr1.cli import build_app
from searchr1.core.datasets import DatasetError
from searchr1.learner.tools.data import load_tasks
from searchr1.learner.tools.fetch import eval_split_name, fetch_search_r1_data, search_r1_row

# Search-R1's make_prefix(template_type='base'), spelled out from its data scripts.
SEARCH_R1_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: "
)

SOURCES: dict[str, dict[str, list[dict]]] = {
    "nq": {
        "train": [
            {"id": "train_0", "question": "who wrote the play hamlet ", "golden_answers": ["William Shakespeare"]},
            {"id": "train_1", "question": "capital city of france?", "golden_answers": ["Paris", "paris"]},
            {"id": "train_2", "question": "  when was {braces} used", "golden_answers": ["1990"]},
        ],
        "dev": [{"id": "dev_0", "question": "dev question", "golden_answers": ["d"]}],
        "test": [
            {"id": "test_0", "question": "who sang imagine", "golden_answers": ["John Lennon"]},
            {"id": "test_1", "question": "how tall is everest?", "golden_answers": ["8,849 m", "29,032 ft"]},
        ],
    },
    "hotpotqa": {
        "train": [{"id": "5a8b", "question": "Which band formed first, A or B",
                   "golden_answers": ["A"], "metadata": {"type": "comparison", "level": "hard"}}],
        "dev": [{"id": "5a8c", "question": "Who directed the film X?", "golden_answers": ["Y"],
                 "metadata": {"type": "bridge", "level": "medium"}}],
    },
    "bamboogle": {
        "test": [{"id": "b0", "question": "Who was president when the inventor of Z was born",
                  "golden_answers": ["Lincoln"]}],
    },
    "popqa": {  # only a train split: Search-R1 evaluates on it
        "train": [{"id": "p0", "question": "What is Q's occupation", "golden_answers": ["poet", "writer"]}],
    },
}


def _write_repo(root: Path) -> Path:
    lines = ["---", "configs:"]
    for source, splits in SOURCES.items():
        lines += [f"- config_name: {source}", "  data_files:"]
        for split, rows in splits.items():
            (root / source).mkdir(parents=True, exist_ok=True)
            (root / source / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            lines += [f"  - split: {split}", f"    path: {source}/{split}.jsonl"]
    lines.append("---")
    (root / "README.md").write_text("\n".join(lines) + "\n# tiny FlashRAG-style datasets\n")
    return root


@pytest.fixture()
def flashrag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return _write_repo(tmp_path / "FlashRAG_datasets")


def _expected(source: str, split: str, picked: str) -> list[dict]:
    out = []
    for i, r in enumerate(SOURCES[source][picked]):
        q = r["question"].strip()
        if q[-1] != "?":
            q += "?"
        row = dict(r, question=q, data_source=source,
                   prompt=[{"role": "user", "content": SEARCH_R1_PREFIX + q + "\n"}], ability="fact-reasoning",
                   reward_model={"style": "rule", "ground_truth": {"target": r["golden_answers"]}},
                   extra_info={"split": split, "index": i})
        out.append(row)
    return out


def _rows(path: Path) -> list[dict]:
    rows = pq.read_table(path).to_pylist()
    for r in rows:  # sources without metadata get null in the concatenated file, as with Search-R1's script
        if r.get("metadata") is None:
            r.pop("metadata", None)
    return rows


@pytest.mark.parametrize("template", ["base", "instruct"])
def test_fetch_matches_search_r1_rows(flashrag: Path, tmp_path: Path, template: str):
    out = tmp_path / "out"
    result = fetch_search_r1_data(out, train_sources=["nq", "hotpotqa"],
                                  test_sources=["nq", "popqa", "hotpotqa", "bamboogle"],
                                  repo=str(flashrag), template=template, cache_dir=str(tmp_path / "cache"))
    assert result.train == out / "train.parquet" and result.test == out / "test.parquet"
    assert result.train_counts == {"nq": 3, "hotpotqa": 1}
    assert result.test_counts == {"nq": 2, "popqa": 1, "hotpotqa": 1, "bamboogle": 1}

    train = _rows(out / "train.parquet")
    assert train == _expected("nq", "train", "train") + _expected("hotpotqa", "train", "train")
    test = _rows(out / "test.parquet")
    assert test == (_expected("nq", "test", "test") + _expected("popqa", "test", "train")
                    + _expected("hotpotqa", "test", "dev") + _expected("bamboogle", "test", "test"))
    # the prompt bytes, spelled out once more for one row
    assert train[2]["prompt"][0]["content"].encode() == (SEARCH_R1_PREFIX + "when was {braces} used?\n").encode()
    # Search-R1's column order: FlashRAG's columns, then the added ones
    names = pq.read_schema(out / "train.parquet").names
    assert names[:3] == ["id", "question", "golden_answers"]
    assert names.index("data_source") < names.index("prompt") < names.index("ability") \
        < names.index("reward_model") < names.index("extra_info")


def test_fetched_parquet_reads_back_as_tasks(flashrag: Path, tmp_path: Path):
    out = tmp_path / "out"
    fetch_search_r1_data(out, train_sources=["nq", "hotpotqa"], test_sources=["nq", "bamboogle"],
                         repo=str(flashrag), cache_dir=str(tmp_path / "cache"))
    specs = load_tasks(out / "train.parquet")
    assert [s.task_id for s in specs] == ["train_0", "train_1", "train_2", "5a8b"]
    assert [s.data_source for s in specs] == ["nq", "nq", "nq", "hotpotqa"]
    assert specs[1].question == "capital city of france?" and specs[1].golden_answers == ["Paris", "paris"]
    assert specs[0].metadata["ability"] == "fact-reasoning"

    r = CliRunner().invoke(build_app(), ["data", "prepare", str(out / "test.parquet"), str(tmp_path / "t.jsonl")])
    assert r.exit_code == 0, r.output
    tasks = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(t["task_id"], t["data_source"]) for t in tasks] == [("test_0", "nq"), ("test_1", "nq"),
                                                                  ("b0", "bamboogle")]
    assert tasks[1]["golden_answers"] == ["8,849 m", "29,032 ft"]


def test_cli_fetch(flashrag: Path, tmp_path: Path):
    out = tmp_path / "cli"
    r = CliRunner().invoke(build_app(), ["data", "fetch", str(out), "--repo", str(flashrag), "--train-sources",
                                         "nq", "--test-sources", "bamboogle,popqa",
                                         "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    assert "wrote 3 rows" in r.output and "wrote 2 rows" in r.output and "bamboogle 1, popqa 1" in r.output
    assert [x["data_source"] for x in _rows(out / "test.parquet")] == ["bamboogle", "popqa"]

    r = CliRunner().invoke(build_app(), ["data", "fetch", str(tmp_path / "bad"), "--repo", str(flashrag),
                                         "--train-sources", "nq", "--test-sources", "", "--template", "chat"])
    assert r.exit_code != 0 and "unknown data template" in r.output


def test_unknown_source_is_a_clear_error(flashrag: Path, tmp_path: Path):
    with pytest.raises(DatasetError, match="cannot load source 'squad'"):
        fetch_search_r1_data(tmp_path / "o", train_sources=["squad"], test_sources=[], repo=str(flashrag),
                             cache_dir=str(tmp_path / "cache"))


def test_row_rules():
    row = search_r1_row({"question": " x ", "golden_answers": ["a"]}, 7, "musique", "test")
    assert row["question"] == "x?" and row["extra_info"] == {"split": "test", "index": 7}
    assert row["prompt"][0]["content"] == SEARCH_R1_PREFIX + "x?\n"
    with pytest.raises(DatasetError, match="musique test row 3"):
        search_r1_row({"question": "  ", "golden_answers": ["a"]}, 3, "musique", "test")
    with pytest.raises(DatasetError, match="golden_answers"):
        search_r1_row({"question": "q"}, 0, "nq", "train")
    assert eval_split_name(["train", "dev", "test"]) == "test"
    assert eval_split_name(["train", "dev"]) == "dev"
    assert eval_split_name(["train"]) == "train"
    with pytest.raises(DatasetError):
        eval_split_name([])
