"""`searchr1 eval` pieces without a model or servers: the test-set reader (a parquet the test writes in
Search-R1's row shape, and our tasks JSONL), the pure aggregation by configurable group keys (hand-checked
numbers), the Markdown and rich reports, and `run_eval` against a scripted generator and a fake reward
client."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest

from searchr1.core.datasets import Question
from searchr1.core.protocol import make_prompt, render_prompt
from searchr1.rollout.engine import TurnOutput, TurnRequest
from searchr1.rollout.evaluation.evaluate import (
    EvalConfig,
    EvalDataError,
    EvalRecord,
    evaluate,
    prompt_text,
    read_questions,
    row_to_question,
    run_eval,
    sample_seed,
)
from searchr1.rollout.evaluation.report import markdown_report, summary_table
from searchr1.rollout.evaluation.stats import MISSING, aggregate, metrics_of
from searchr1.rollout.settings import AgentSettings, EvalSettings

WORLD_GROUPS = ("data_source", "question_type", "entity_kind", "knowledge")
"""The tiny world's breakdown, as its config names it (`[rollout.eval] group_by`)."""


def config(agent: AgentSettings | None = None, *, seed: int = 0, temperature: float | None = None,
           group_by: tuple[str, ...] | None = None, **how) -> EvalConfig:
    """The eval config of `agent` (default settings when None) and `group_by` (`[rollout.eval]`'s default
    when None)."""
    groups = EvalSettings() if group_by is None else EvalSettings(group_by=list(group_by))
    return EvalConfig.from_settings(agent or AgentSettings(), groups, seed=seed, temperature=temperature, **how)


def _groups(q: Question) -> tuple:
    return tuple(q.group_value(k) for k in WORLD_GROUPS)

# ------------------------------------------------------------------------------------------------ reader


def _searchr1_row(i: int, question: str, golds: list[str], source: str, qtype: str, kind: str, known: bool):
    """A row as Search-R1's `scripts/data_process/nq_search.py` writes it, with our world's extra_info."""
    q = question if question.endswith("?") else question + "?"
    return {
        "id": f"test_{i}", "question": q, "golden_answers": golds, "data_source": source,
        "prompt": [{"role": "user", "content": make_prompt(q)}], "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
        "extra_info": {"split": "test", "index": i, "question_type": qtype, "entity_kind": kind,
                       "knowledge": "known" if known else "unknown", "hops": 1, "gold_doc_ids": [i]},
    }


def _write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_reads_searchr1_parquet_rows_unchanged(tmp_path):
    rows = [_searchr1_row(0, "what is the capital of france", ["Paris"], "world_known_single_hop", "capital",
                          "city", True),
            _searchr1_row(1, "who wrote pride and prejudice", ["Jane Austen", "Austen"], "world_unknown_two_hop",
                          "author", "person", False)]
    path = _write_parquet(tmp_path / "test.parquet", rows)
    qs = read_questions(path)
    assert [q.task_id for q in qs] == ["test_0", "test_1"]
    assert qs[0].question == "what is the capital of france?"
    assert qs[1].golden_answers == ["Jane Austen", "Austen"]
    assert _groups(qs[1]) == ("world_unknown_two_hop", "author", "person", "unknown")
    assert qs[0].messages == [{"role": "user", "content": make_prompt("what is the capital of france?")}]
    assert [q.task_id for q in read_questions(path, limit=1)] == ["test_0"]


def test_reads_plain_nq_style_rows_and_prefers_ground_truth_target(tmp_path):
    # Search-R1's NQ test rows: extra_info has only split/index; no question type anywhere
    rows = [{"id": "test_0", "question": "who sang x?", "golden_answers": ["A"], "data_source": "nq",
             "prompt": [{"role": "user", "content": make_prompt("who sang x?")}], "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": ["A", "B"]}},
             "extra_info": {"split": "test", "index": 0}}]
    q = read_questions(_write_parquet(tmp_path / "nq.parquet", rows))[0]
    assert q.golden_answers == ["A", "B"]
    assert _groups(q) == ("nq", None, None, None)
    # no id column: the id is made from data_source, split and index
    q2 = row_to_question({"question": "q", "golden_answers": ["a"], "data_source": "hotpotqa",
                          "extra_info": {"split": "test", "index": 7}}, 0)
    assert q2.task_id == "hotpotqa-test-7" and q2.messages is None


def test_reads_tasks_jsonl(tmp_path):
    path = tmp_path / "tasks-test.jsonl"
    lines = [{"task_id": "world-test-0", "question": "q0?", "golden_answers": ["a"], "data_source": "d",
              "split": "test", "metadata": {"question_type": "capital", "entity_kind": "city",
                                            "knowledge": "known", "hops": "1"}},
             {"task_id": "world-test-1", "question": "q1?", "golden_answers": ["b"]}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    qs = read_questions(path)
    assert [(q.task_id, *_groups(q)) for q in qs] == \
        [("world-test-0", "d", "capital", "city", "known"), ("world-test-1", "unknown", None, None, None)]


@pytest.mark.parametrize("content, match", [
    ('{"question": "q"}\n', "no gold answers"),
    ('{"golden_answers": ["a"]}\n', "no 'question'"),
    ('{"question": "q", "golden_answers": ["a"], "id": "x"}\n{"question": "r", "golden_answers": ["b"], "id": "x"}\n',
     "not unique"),
    ("not json\n", "not JSON"),
    ("", "no questions"),
])
def test_bad_test_sets_are_refused_with_a_message(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(EvalDataError, match=match):
        read_questions(path)


def test_missing_or_unknown_file_type(tmp_path):
    with pytest.raises(EvalDataError, match="not found"):
        read_questions(tmp_path / "nope.parquet")
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(EvalDataError, match="parquet or .jsonl"):
        read_questions(tmp_path / "x.csv")


class ChatTok:
    chat_template = "yes"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"


def test_prompt_from_row_messages_or_question():
    msgs = [{"role": "user", "content": "CUSTOM Question: q?\n"}]
    q = Question("a", "q?", ["x"], messages=msgs)
    assert prompt_text(q, ChatTok()) == "<user>CUSTOM Question: q?\n</user><assistant>"
    assert prompt_text(q, object()) == "CUSTOM Question: q?\n"  # base model: the content, as Search-R1
    bare = Question("b", "q", ["x"])
    assert prompt_text(bare, ChatTok()) == render_prompt("q", ChatTok())


# ------------------------------------------------------------------------------------------- aggregation


def rec(qid, mode="greedy", sample=0, ds="A", qtype=None, kind=None, knowledge=None, em=0.0, f1=0.0, sr1=0.0,
        fmt=0.0, searches=0, turns=1, tokens=10, gen=5, finish="answer", cover=None, error=None, score_error=None):
    scored = score_error is None
    return EvalRecord(qid=qid, mode=mode, sample=sample, data_source=ds, question="q", golden_answers=["a"],
                      response="r", answer="a", finish_reason=finish, num_turns=turns, num_searches=searches,
                      response_tokens=tokens, generated_tokens=gen, em=em if scored else None,
                      cover_em=(em if cover is None else cover) if scored else None, f1=f1 if scored else None,
                      searchr1_em=sr1 if scored else None, format_valid=fmt if scored else None, error=error,
                      score_error=score_error, groups={"question_type": qtype, "entity_kind": kind, "knowledge": knowledge})


RECORDS = [
    rec("q1", ds="A", qtype="single", kind="city", knowledge="known", em=1, f1=1, sr1=1, fmt=1, searches=0,
        turns=1, tokens=10, gen=10),
    rec("q2", ds="A", qtype="two", em=0, f1=0.5, sr1=0, fmt=1, searches=2, turns=3, tokens=30, gen=12),
    rec("q3", ds="B", em=0, f1=0, sr1=1, fmt=0, searches=1, turns=2, tokens=20, gen=8, finish="length"),
    rec("q1", "sampled", 0, ds="A", qtype="single", kind="city", knowledge="known", em=1, f1=1, fmt=1,
        searches=1, turns=2),
    rec("q1", "sampled", 1, ds="A", qtype="single", kind="city", knowledge="known", em=0, f1=0.25, fmt=0,
        searches=0, turns=1),
    rec("q2", "sampled", 0, ds="A", qtype="two", em=0, f1=0, fmt=1, searches=3, turns=4),
    rec("q2", "sampled", 1, ds="A", qtype="two", em=1, f1=1, fmt=1, searches=2, turns=3),
]


def test_metrics_hand_checked_greedy():
    m = metrics_of(RECORDS[:3])
    assert m["trajectories"] == 3 and m["questions"] == 3
    assert m["em"] == pytest.approx(1 / 3)
    assert m["f1"] == pytest.approx(0.5)          # (1 + 0.5 + 0) / 3
    assert m["searchr1_em"] == pytest.approx(2 / 3)
    assert m["format_valid"] == pytest.approx(2 / 3)
    assert m["searches"] == pytest.approx(1.0)    # (0 + 2 + 1) / 3
    assert m["searched"] == pytest.approx(2 / 3)  # q2 and q3 searched
    assert m["turns"] == pytest.approx(2.0)
    assert m["response_tokens"] == pytest.approx(20.0)
    assert m["generated_tokens"] == pytest.approx(10.0)
    assert m["answered"] == pytest.approx(2 / 3)  # q3 ended by length
    assert metrics_of([]) == {"trajectories": 0, "questions": 0}


def test_aggregate_per_mode_and_group_hand_checked():
    s = aggregate(RECORDS, WORLD_GROUPS)
    assert set(s) == {"greedy", "sampled"}
    g = s["greedy"]
    assert set(g["by"]) == {"data_source", "question_type", "entity_kind", "knowledge"}
    a, b = g["by"]["data_source"]["A"], g["by"]["data_source"]["B"]
    assert (a["questions"], a["em"], a["f1"], a["searches"], a["searched"], a["turns"]) == (2, 0.5, 0.75, 1.0, 0.5, 2.0)
    assert (b["questions"], b["em"], b["format_valid"], b["searched"]) == (1, 0.0, 0.0, 1.0)
    assert list(g["by"]["question_type"]) == [MISSING, "single", "two"]  # q3 has no type
    assert g["by"]["entity_kind"]["city"]["em"] == 1.0
    assert g["by"]["entity_kind"][MISSING]["questions"] == 2
    # sampled: 4 trajectories over 2 questions, means over trajectories
    sm = s["sampled"]["overall"]
    assert (sm["trajectories"], sm["questions"]) == (4, 2)
    assert sm["em"] == pytest.approx(0.5)
    assert sm["f1"] == pytest.approx((1 + 0.25 + 0 + 1) / 4)
    assert sm["format_valid"] == pytest.approx(0.75)
    assert sm["searches"] == pytest.approx(1.5)   # (1 + 0 + 3 + 2) / 4
    assert sm["searched"] == pytest.approx(0.75)
    assert s["sampled"]["by"]["question_type"]["two"]["turns"] == pytest.approx(3.5)
    assert set(s["sampled"]["by"]) == {"data_source", "question_type", "entity_kind", "knowledge"}
    assert s["sampled"]["by"]["data_source"] == {"A": sm}


def test_aggregate_leaves_out_absent_group_keys_and_accepts_json_records():
    recs = [rec("q1", ds="nq", em=1), rec("q2", ds="hotpotqa")]
    s = aggregate([r.to_json() for r in recs], WORLD_GROUPS)  # eval.json's records aggregate the same way
    assert list(s) == ["greedy"]
    assert list(s["greedy"]["by"]) == ["data_source"]
    assert list(s["greedy"]["by"]["data_source"]) == ["hotpotqa", "nq"]
    assert s == aggregate(recs, WORLD_GROUPS)


def test_group_keys_are_the_callers_choice():
    by_default = aggregate(RECORDS, EvalSettings().group_by)  # data_source only: no dataset's fields are built in
    assert list(by_default["greedy"]["by"]) == ["data_source"]
    assert by_default["greedy"]["by"]["data_source"] == aggregate(RECORDS, WORLD_GROUPS)["greedy"]["by"]["data_source"]
    s = aggregate(RECORDS, ("knowledge", "data_source"))  # the caller's order
    assert list(s["greedy"]["by"]) == ["knowledge", "data_source"]
    assert s["greedy"]["by"]["knowledge"]["known"]["em"] == 1.0
    assert aggregate(RECORDS, ("no_such_key",))["greedy"]["by"] == {}
    # the eval.json record keeps each group value as a field of its own, right after data_source
    assert list(RECORDS[0].to_json())[:8] == ["qid", "mode", "sample", "data_source", "question_type",
                                              "entity_kind", "knowledge", "question"]
    with pytest.raises(ValueError, match="record field"):
        config(group_by=("data_source", "em"))


def test_markdown_report_tables():
    md = markdown_report(aggregate(RECORDS, WORLD_GROUPS), {"model": "m", "temperature": 1.0, "samples": 2})
    assert "- **model**: m" in md
    assert "## Greedy (temperature 0)" in md and "## Sampled (temperature 1.0, 2 per question)" in md
    assert md.count("### by data_source") == 2
    # group | questions | trajectories | Search-R1 EM | EM | cover EM | F1 | format valid | searches | ≥1 | turns |
    # tokens | failed searches | unscored
    assert "| all | 3 | 3 | 0.667 | 0.333 | 0.333 | 0.500 | 0.667 | 1.00 | 0.667 | 2.00 | 20.0 | 0 | 0 |" in md
    assert "| A | 2 | 2 | 0.500 | 0.500 | 0.500 | 0.750 | 1.000 | 1.00 | 0.500 | 2.00 | 20.0 | 0 | 0 |" in md
    assert "| all | 2 | 4 | 0.000 | 0.500 | 0.500 | 0.562 |" in md
    assert "No failures" in md


def test_summary_table_renders_all_groups():
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(summary_table(aggregate(RECORDS, WORLD_GROUPS)))
    text = console.export_text()
    for name in ("all", "data_source", "question_type", "knowledge", "  two", "  known", MISSING):
        assert name in text
    lines = [" ".join(line.replace("│", " ").split()) for line in text.splitlines()]
    # group, mode, trajectories, S-R1 EM, EM, cover, F1, format, searches/q, ≥1 search, turns/q, failed, unscored
    assert "all greedy 3 0.67 0.33 0.33 0.50 0.67 1.0 0.67 2.0 0 0" in lines
    assert "sampled 4 0.00 0.50 0.50 0.56 0.75 1.5 0.75 2.5 0 0" in lines
    assert "B greedy 1 1.00 0.00 0.00 0.00 0.00 1.0 1.00 2.0 0 0" in lines
    assert "question_type" in lines


# ----------------------------------------------------------------------------------------- run_eval


class CharCodec:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids)


@dataclass
class ScriptedGenerator:
    """Greedy answers at once; sampled searches on its first turn, then answers."""

    requests: list[tuple[str, TurnRequest]] = field(default_factory=list)
    inflight: int = 0
    peak: int = 0

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        self.requests.append((request_id, request))
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        await asyncio.sleep(0.001)
        self.inflight -= 1
        if request.temperature == 0:
            text = "<think>know it</think><answer> Paris </answer>"
        elif request_id.endswith("-t0"):
            text = "<think>search</think><search> capital </search>"
        else:
            text = "<think>found</think><answer> Lyon </answer>"
        ids = [ord(c) for c in text]
        return TurnOutput(ids, [0.0] * len(ids), text, "stop")

    async def reload(self, weights_path: str, digest=None) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Hit:
    contents: str


@dataclass
class Result:
    scores: list[float]
    components: list[dict[str, float]]


@dataclass
class FakeScorer:
    calls: list[tuple[str, list[dict]]] = field(default_factory=list)

    async def score(self, scorer, items, params=None):
        self.calls.append((scorer, list(items)))
        out = []
        for it in items:
            answer = it["response"].rsplit("<answer>", 1)[-1].split("</answer>")[0].strip()
            hit = float(answer in it["golden_answers"])
            out.append({"exact_match": hit, "substring_match": hit, "f1": 0.5 * hit, "searchr1_em": hit,
                        "format": float(it["response"].startswith("<think>"))}[scorer])
        return Result(out, [{} for _ in out])


async def _search(query: str):
    return [Hit("Paris\nParis is the capital of France.")]


async def test_run_eval_greedy_and_sampled_records_and_scores():
    qs = [Question(f"q{i}", f"question {i}", ["Paris"] if i % 2 == 0 else ["Lyon"], data_source=f"d{i % 2}")
          for i in range(5)]
    gen, scorer = ScriptedGenerator(), FakeScorer()
    seen: list[int] = []
    cfg = config(AgentSettings(max_turns=2, max_tokens_per_turn=64), seed=3, temperature=0.7, samples=2,
                 concurrency=2)
    records = await run_eval(qs, gen, CharCodec(), None, _search, scorer, cfg, lambda r: seen.append(len(r)))
    assert len(records) == 5 * 3 and seen == [3] * 5
    assert [r.qid for r in records] == [f"q{i}" for i in range(5) for _ in range(3)]
    assert [(r.mode, r.sample) for r in records[:3]] == [("greedy", 0), ("sampled", 0), ("sampled", 1)]
    greedy = [r for r in records if r.mode == "greedy"]
    sampled = [r for r in records if r.mode == "sampled"]
    assert all(r.num_searches == 0 and r.num_turns == 1 and r.answer == "Paris" for r in greedy)
    assert all(r.num_searches == 1 and r.num_turns == 2 and r.answer == "Lyon" for r in sampled)
    assert [r.em for r in greedy] == [1.0, 0.0, 1.0, 0.0, 1.0]   # Paris is gold for even questions
    assert [r.em for r in sampled] == [0.0, 0.0, 1.0, 1.0] * 2 + [0.0, 0.0]
    assert all(r.format_valid == 1.0 for r in records)
    assert all("<information>" in r.response for r in sampled)
    assert records[0].response_tokens == len("<think>know it</think><answer> Paris </answer>")
    # scored per question: one request per scorer, items in trajectory order, our item shape
    assert sorted({name for name, _ in scorer.calls}) == ["exact_match", "f1", "format", "searchr1_em",
                                                          "substring_match"]
    assert all(len(items) == 3 and set(items[0]) == {"prompt", "response", "golden_answers", "num_searches"}
               for _, items in scorer.calls)
    assert scorer.calls[0][1][0]["prompt"] == render_prompt("question 0")
    # greedy is temperature 0; samples carry distinct seeds from (seed, question, sample); bounded concurrency
    temps = {rid.rsplit("-t", 1)[0]: (req.temperature, req.seed) for rid, req in gen.requests if rid.endswith("-t0")}
    assert temps["eval-0-greedy0"] == (0.0, 0) and temps["eval-3-greedy0"] == (0.0, 3)
    assert temps["eval-4-sampled1"] == (0.7, sample_seed(3, 4, 1))
    assert len({seed for t, seed in temps.values() if t > 0}) == 10
    assert gen.peak <= 2 * 3


async def test_evaluate_writes_json_and_markdown(tmp_path):
    rows = [_searchr1_row(i, f"question {i}", ["Paris"], "world_known_single_hop" if i < 2 else "world_unknown_single_hop",
                          "capital", "city", i < 2) for i in range(3)]
    data = _write_parquet(tmp_path / "test.parquet", rows)
    run = await evaluate(data, tmp_path / "out", ScriptedGenerator(), CharCodec(), None, _search, FakeScorer(),
                         config(AgentSettings(max_turns=2), samples=1, group_by=WORLD_GROUPS),
                         meta={"model": "scripted"})
    doc = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert set(doc) == {"meta", "summary", "records"}
    assert doc["meta"]["model"] == "scripted" and doc["meta"]["questions"] == 3 and doc["meta"]["samples"] == 1
    assert len(doc["records"]) == 6
    assert doc["summary"]["greedy"]["overall"]["em"] == 1.0 and doc["summary"]["sampled"]["overall"]["em"] == 0.0
    assert set(doc["summary"]["greedy"]["by"]["knowledge"]) == {"known", "unknown"}
    assert list(doc["summary"]["greedy"]["by"]) == list(WORLD_GROUPS) and doc["meta"]["group_by"] == list(WORLD_GROUPS)
    assert (doc["records"][0]["question_type"], doc["records"][0]["knowledge"]) == ("capital", "known")
    assert doc == run.document
    md = (tmp_path / "out" / "eval.md").read_text()
    assert "### by knowledge" in md and "| world_unknown_single_hop | 1 | 1 |" in md


def test_config_bounds():
    with pytest.raises(ValueError):
        config(samples=-1)
    with pytest.raises(ValueError):
        config(greedy=False, samples=0)


# ------------------------------------------------------------------------------- failures are counted


def test_failures_are_counted_and_scores_average_over_the_scored():
    recs = [rec("q1", em=1, sr1=1), rec("q2", em=0, sr1=1, error="search failed: UNAUTHENTICATED", finish="error"),
            rec("q3", score_error="reward service refused the request (401)"),
            rec("q4", em=1, sr1=0, finish="retriever_unavailable")]
    m = metrics_of(recs)
    assert (m["trajectories"], m["scored"], m["failed_searches"], m["failed_scores"]) == (4, 3, 2, 1)
    assert m["failure_rate"] == pytest.approx(3 / 4)
    assert m["em"] == pytest.approx(2 / 3) and m["searchr1_em"] == pytest.approx(2 / 3)  # q3 left out
    assert metrics_of([rec("q1", score_error="x")])["em"] is None  # nothing scored: no number, not 0
    md = markdown_report(aggregate(recs, ("data_source",)), {"model": "m"})
    assert "**Failures: 2 of 4 trajectories had a failed search, 1 could not be scored (75.0% of trajectories).**" in md


class RefusingScorer:
    async def score(self, scorer, items, params=None):
        from searchr1.core.clients.reward import RewardError

        raise RewardError("reward service refused the request (401): missing bearer token", 401)


async def _refused_search(query: str):
    from searchr1.core.clients.retriever import RetrieverError

    raise RetrieverError("retriever refused the search: UNAUTHENTICATED", None)


async def test_a_refused_score_or_search_is_recorded_on_the_trajectory_not_raised():
    qs = [Question("q0", "question 0", ["Lyon"], data_source="d")]
    cfg = config(AgentSettings(max_turns=2), seed=3, temperature=0.7, samples=1)
    records = await run_eval(qs, ScriptedGenerator(), CharCodec(), None, _search, RefusingScorer(), cfg)
    assert all(r.score_error and "401" in r.score_error and r.em is None for r in records)
    records = await run_eval(qs, ScriptedGenerator(), CharCodec(), None, _refused_search, FakeScorer(), cfg)
    sampled = [r for r in records if r.mode == "sampled"]
    assert sampled[0].finish_reason == "error" and "UNAUTHENTICATED" in sampled[0].error
    assert metrics_of(sampled)["failed_searches"] == 1 and metrics_of(records)["failure_rate"] == 0.5
