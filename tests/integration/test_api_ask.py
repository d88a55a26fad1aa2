"""`searchr1 ask` and `searchr1.api.ask` on the tiny world: the committed warm start (a policy that searches)
on the transformers engine, greedy, against the world's BM25 index served in-process (`--index`), against a
running retriever's Search-R1 `/retrieve` endpoint (the HTTP client), and with a search function of the
caller's own. Each trajectory prints as think / search / information / answer; a file of questions with
gold answers marks each answer; bad input is one line and exit 2, an unreachable retriever exit 1."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from searchr1.api import Passage, ask, open_asker, turns_of


def _ask(*args: str):
    from searchr1.cli import build_app

    return CliRunner().invoke(build_app(), ["ask", *args], env={"COLUMNS": "120"})


def _one_line(r, code: int, text: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == code, (r.exit_code, r.output)
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], r.stderr


@pytest.fixture(scope="module")
def questions(tiny_world, tmp_path_factory):
    world, _, _ = tiny_world
    rows = [json.loads(line) for line in (world / "tasks-test.jsonl").read_text().splitlines()[:2]]
    path = tmp_path_factory.mktemp("q") / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def test_ask_one_question_against_an_index_it_serves(tiny_world):
    world, index, warm = tiny_world
    r = _ask("In which city is Reixros Works headquartered?", "--model", str(warm), "--index", str(index),
             "--engine", "hf")
    assert r.exit_code == 0, r.output
    out = r.stdout
    for heading in ("question", "think", "search", "information", "answer"):
        assert f"{heading} ─" in out, out
    assert 'Doc 1(Title: "Reixros Works")' in out and "finish: answer" in out and "1 search(es)" in out


def test_ask_a_file_marks_each_answer_and_json_is_one_object_a_question(tiny_world, questions):
    _, index, warm = tiny_world
    path, rows = questions
    r = _ask("--file", str(path), "--model", str(warm), "--index", str(index), "--engine", "hf")
    assert r.exit_code == 0, r.output
    assert "[1/2] question" in r.stdout and "[2/2] question" in r.stdout
    assert r.stdout.count("(gold: ") == 2 and ("correct" in r.stdout or "wrong" in r.stdout)
    j = _ask("--file", str(path), "--model", str(warm), "--index", str(index), "--engine", "hf", "--json")
    assert j.exit_code == 0, j.output
    docs = [json.loads(line) for line in j.stdout.splitlines()]
    assert [d["question"] for d in docs] == [row["question"] for row in rows]
    assert all(d["turns"][-1]["kind"] == "answer" and d["answer"] == d["turns"][-1]["text"] for d in docs)


async def test_the_api_against_a_retrieve_endpoint_and_a_search_function_of_ones_own(tiny_world):
    """The same question through our retriever's Search-R1 `/retrieve` (HTTP client) and through a plain
    function over the corpus: the same passages, so the same greedy trajectory."""
    from searchr1.retriever.server import open_index, start_retriever
    from searchr1.retriever.settings import RetrieverSettings

    world, index, warm = tiny_world
    settings = RetrieverSettings(index=index, grpc_port=0, http_port=0, metrics_port=None)
    running = await start_retriever(settings, await asyncio.to_thread(open_index, settings))
    question = "In which city is Reixros Works headquartered?"
    try:
        async with open_asker(warm, retriever=running.http.url, engine="hf") as asker:
            over_http = await asker.ask(question)
    finally:
        await running.stop()
    corpus = [json.loads(line)["contents"] for line in (world / "corpus.jsonl").read_text().splitlines()]
    seen: list[str] = []

    def search(query: str) -> list[Passage]:  # a synchronous function of one's own, over the same hits
        seen.append(query)
        return [Passage(c) for c in corpus if query.strip() in c][:3]

    mine = await asyncio.to_thread(ask, question, warm, search=search, engine="hf")
    assert over_http.num_searches >= 1 and over_http.searches[0] == "Reixros Works"
    assert seen == over_http.searches[:1] and mine.answer is not None
    assert [t.kind for t in over_http.turns][:4] == ["think", "search", "information", "think"]


def test_turns_of_a_response():
    r = "<think> a </think>\n<search> q </search>\n\n<information>Doc 1(Title: T) x</information>\n\nbad<answer> y </answer>"
    assert [(t.kind, t.text) for t in turns_of(r)] == [("think", "a"), ("search", "q"),
                                                      ("information", "Doc 1(Title: T) x"), ("text", "bad"),
                                                      ("answer", "y")]


def test_bad_input_is_one_line(tiny_world, tmp_path):
    _, index, warm = tiny_world
    _one_line(_ask("--model", str(warm), "--index", str(index)), 2, "give a question or --file")
    _one_line(_ask("q", "--model", str(warm)), 2, "give where to search")
    _one_line(_ask("q", "--model", str(warm), "--index", str(index), "--retriever", "127.0.0.1:1"), 2,
              "give where to search")
    _one_line(_ask("q", "--model", str(warm), "--index", str(tmp_path)), 2, "is not an index directory")
    _one_line(_ask("q", "--model", str(tmp_path / "nope"), "--index", str(index)), 2,
              f"model directory {tmp_path / 'nope'} not found")
    _one_line(_ask("--file", str(tmp_path / "q.txt"), "--model", str(warm), "--index", str(index)), 2,
              "question file")
    _one_line(_ask("q", "--model", str(warm), "--retriever", "127.0.0.1:1", "-c", str(_fast_retries(tmp_path))), 1,
              "retriever at 127.0.0.1:1 does not answer")


def _fast_retries(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text("[rollout.retriever]\nretries = 0\ntimeout_s = 1\n")
    return config
