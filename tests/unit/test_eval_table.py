"""Search-R1's Table 3 layout from `searchr1 eval` results: hand-made records of two models, aggregated as
eval.json holds them, tabulated (greedy only, the paper's column order, the unweighted average), rendered
as Markdown and through `searchr1 eval --table`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchr1.rollout.evaluation.report import eval_labels, paper_table_markdown, read_eval
from searchr1.rollout.evaluation.stats import SEARCH_R1_TEST_SETS, aggregate, paper_table
from searchr1.rollout.settings import EvalSettings

GROUP_BY = EvalSettings().group_by


def _rec(qid: str, source: str, searchr1_em: float, mode: str = "greedy", em: float | None = None) -> dict:
    return {"qid": qid, "mode": mode, "sample": 0, "data_source": source, "question": "q", "golden_answers": ["a"],
            "response": "r", "answer": "a", "finish_reason": "answer", "num_turns": 2, "num_searches": 1,
            "response_tokens": 10, "generated_tokens": 8, "em": searchr1_em if em is None else em, "f1": 0.5,
            "searchr1_em": searchr1_em, "format_valid": 1.0, "error": None}


def _doc(model: str, scores: dict[str, list[float]], max_turns: int = 4) -> dict:
    """eval.json of a model: per data_source the greedy searchr1_em of each question, plus sampled
    trajectories scoring 1.0 everywhere (which the table must ignore)."""
    records = []
    for source, ems in scores.items():
        for i, e in enumerate(ems):
            records += [_rec(f"{source}-{i}", source, e), _rec(f"{source}-{i}", source, 1.0, mode="sampled")]
    return {"meta": {"model": model, "max_turns": max_turns}, "summary": aggregate(records, GROUP_BY), "records": records}


# nq 2/4 = .5, triviaqa 1/2, popqa 0/1, hotpotqa 1/1, 2wiki 1/4, musique 0/2, bamboogle 3/4
FULL = {"bamboogle": [1, 1, 1, 0], "nq": [1, 0, 1, 0], "triviaqa": [1, 0], "popqa": [0], "hotpotqa": [1],
        "2wikimultihopqa": [1, 0, 0, 0], "musique": [0, 0]}
# hand-checked: (.5 + .5 + 0 + 1 + .25 + 0 + .75) / 7 = 3 / 7
FULL_AVG = 3 / 7


def test_columns_in_search_r1_order_greedy_scores_and_unweighted_average():
    t = paper_table([("base", _doc("models/base", FULL))])
    assert [title for _, title in t.columns] == ["NQ", "TriviaQA", "PopQA", "HotpotQA", "2Wiki", "Musique",
                                                 "Bamboogle"]
    assert [ds for ds, _ in t.columns] == [ds for ds, _ in SEARCH_R1_TEST_SETS]
    (row,) = t.rows
    assert row.scores == {"nq": 0.5, "triviaqa": 0.5, "popqa": 0.0, "hotpotqa": 1.0, "2wikimultihopqa": 0.25,
                          "musique": 0.0, "bamboogle": 0.75}
    assert row.average == pytest.approx(FULL_AVG) and row.complete and row.max_turns == 4
    assert row.questions == {"nq": 4, "triviaqa": 2, "popqa": 1, "hotpotqa": 1, "2wikimultihopqa": 4,
                             "musique": 2, "bamboogle": 4}


def test_rows_per_model_missing_sets_and_extra_sources():
    partial = {"nq": [1, 1], "hotpotqa": [0, 1], "world": [1, 0, 0, 0]}
    t = paper_table([("a", _doc("m/a", FULL)), ("b", _doc("m/b", partial))])
    assert [ds for ds, _ in t.columns] == [ds for ds, _ in SEARCH_R1_TEST_SETS] + ["world"]
    a, b = t.rows
    assert a.scores.keys() == {ds for ds, _ in SEARCH_R1_TEST_SETS} and not a.complete
    assert a.average == pytest.approx(FULL_AVG)
    # (1 + .5 + .25) / 3: the mean of the columns the row has
    assert b.scores == {"nq": 1.0, "hotpotqa": 0.5, "world": 0.25} and b.average == pytest.approx(1.75 / 3)


def test_other_metrics_and_bad_inputs():
    doc = _doc("m", {"nq": [1, 0]})
    recs = [_rec("q0", "nq", 1.0, em=0.0), _rec("q1", "nq", 0.0, em=0.0)]
    t = paper_table([("m", {"meta": {}, "summary": aggregate(recs, GROUP_BY)})], metric="em")
    assert t.rows[0].scores == {"nq": 0.0} and t.rows[0].max_turns is None
    assert paper_table([("m", doc)], metric="f1").rows[0].scores == {"nq": 0.5}
    with pytest.raises(ValueError, match="metric must be one of"):
        paper_table([("m", doc)], metric="accuracy")
    with pytest.raises(ValueError, match="m: no greedy trajectories"):
        paper_table([("m", {"summary": aggregate([_rec("q", "nq", 1.0, mode="sampled")], GROUP_BY)})])
    with pytest.raises(ValueError, match="m: no per-data_source breakdown"):
        paper_table([("m", {"summary": aggregate([_rec("q", "nq", 1.0)], ["kind"])})])
    with pytest.raises(ValueError, match="no evaluations"):
        paper_table([])


def test_markdown_layout():
    t = paper_table([("base", _doc("models/base", FULL)), ("instruct", _doc("models/instruct", {"nq": [1]}))])
    md = paper_table_markdown(t).splitlines()
    assert md[0] == ("| Model | NQ | TriviaQA | PopQA | HotpotQA | 2Wiki | Musique | Bamboogle | Avg. | Failed | "
                     "Setting |")
    assert md[1] == "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    assert md[2] == "| base | 0.500 | 0.500 | 0.000 | 1.000 | 0.250 | 0.000 | 0.750 | 0.429 | 0 | – |"
    assert md[3] == "| instruct | 1.000 | – | – | – | – | – | – | 1.000† | 0 | – |"
    assert md[5].startswith("Search-R1 EM (qa_em.compute_score_em) of the greedy trajectory; max_turns 4; ")
    assert "questions: NQ 1/4, TriviaQA 2," in md[5] and "† over the test sets the row has." in md[5]


def test_failures_and_fingerprint_shown_beside_the_scores():
    doc = _doc("models/base", {"nq": [1, 0]})
    recs = [_rec("q0", "nq", 1.0), {**_rec("q1", "nq", 0.0), "error": "search failed: UNAUTHENTICATED"}]
    doc = {"meta": {"max_turns": 4, "fingerprint": {"id": "ab" * 32}}, "summary": aggregate(recs, ("data_source",))}
    (row,) = paper_table([("base", doc)]).rows
    assert row.failed == 1 and row.fingerprint == "ab" * 32
    assert paper_table_markdown(paper_table([("base", doc)])).splitlines()[2].endswith("| 1 | abababababab |")


def test_labels_from_the_evaluated_models():
    docs = [_doc(m, {"nq": [1]}) for m in ("runs/a/weights/step-10", "runs/b/weights/step-10", "models/Qwen")]
    assert eval_labels([("x/eval.json", docs[0]), ("y/eval.json", docs[2])]) == ["step-10", "Qwen"]
    assert eval_labels([("x/eval.json", docs[0]), ("y/eval.json", _doc("runs/a/best/step-10", {}))]) == \
        ["weights/step-10", "best/step-10"]
    labels = eval_labels([(f"out{i}/eval.json", d) for i, d in enumerate(docs)])
    assert labels == ["weights/step-10 (out0)", "weights/step-10 (out1)", "models/Qwen (out2)"]


def test_read_eval_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="no such eval.json"):
        read_eval(tmp_path)
    (tmp_path / "eval.json").write_text("[1]")
    with pytest.raises(ValueError, match="not an eval.json of `searchr1 eval`"):
        read_eval(tmp_path)
    (tmp_path / "eval.json").write_text("{")
    with pytest.raises(ValueError, match="not a readable eval.json"):
        read_eval(tmp_path / "eval.json")


def test_eval_table_command(tmp_path: Path):
    from searchr1.cli import build_app

    for name, scores in (("base", FULL), ("instruct", {**FULL, "nq": [1, 1, 1, 1]})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "eval.json").write_text(json.dumps(_doc(f"models/{name}", scores)))
    runner = CliRunner()
    r = runner.invoke(build_app(), ["eval", "--table", str(tmp_path / "base"), "--table",
                                    str(tmp_path / "instruct" / "eval.json"), "--out", str(tmp_path / "t")],
                      env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "Bamboogle" in r.output and "0.429" in r.output and "0.500" in r.output
    md = (tmp_path / "t" / "table.md").read_text().splitlines()
    # instruct: nq 1.0 instead of .5 → (3 + .5) / 7 = .5
    assert md[2].startswith("| base | 0.500 |") and md[3] == \
        "| instruct | 1.000 | 0.500 | 0.000 | 1.000 | 0.250 | 0.000 | 0.750 | 0.500 | 0 | – |"
    text = "\n".join(md)
    assert "### em" in text and "### cover_em" in text and "### f1" in text  # beside Search-R1's EM
    assert "Avg. per metric" in r.output and "cover EM" in r.output
    bad = runner.invoke(build_app(), ["eval", "--table", str(tmp_path / "base"), "--model", "m"])
    assert bad.exit_code == 2 and "without --model/--data" in bad.output
    missing = runner.invoke(build_app(), ["eval", "--table", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no such eval.json" in missing.output
    nothing = runner.invoke(build_app(), ["eval"])
    assert nothing.exit_code == 2 and "give --model and --data" in nothing.output


def test_ids_repeated_across_test_sets_are_qualified_by_source(tmp_path: Path):
    from searchr1.rollout.evaluation.evaluate import EvalDataError, read_questions

    path = tmp_path / "test.jsonl"
    rows = [{"id": "test_0", "question": "q0", "golden_answers": ["a"], "data_source": "nq"},
            {"id": "test_1", "question": "q1", "golden_answers": ["b"], "data_source": "nq"},
            {"id": "test_0", "question": "q2", "golden_answers": ["c"], "data_source": "triviaqa"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [q.task_id for q in read_questions(path)] == ["nq/test_0", "nq/test_1", "triviaqa/test_0"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    assert [q.task_id for q in read_questions(path)] == ["test_0", "test_1"]  # unique: left as they are
    path.write_text("".join(json.dumps({**r, "data_source": "nq"}) + "\n" for r in rows))
    with pytest.raises(EvalDataError, match="not unique within a data_source"):
        read_questions(path)
