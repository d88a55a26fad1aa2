"""The trajectory viewer without a browser: blocks and masks, gold highlighting, SVG plots, per-step
series, the archive store (projection, duplicates, live parts, text search) and the app's answers to bad
input and to the token (TestClient, real archive parts written by the learner's writer)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from searchr1.cli import build_app
from searchr1.core.protocol import INVALID_ACTION_MESSAGE
from searchr1.viewer import store as store_module
from searchr1.viewer.app import create_app
from searchr1.viewer.plots import line_plot
from searchr1.viewer.series import alarm_steps, archive_series, log_series
from searchr1.viewer.settings import ViewerSettings
from searchr1.viewer.store import ArchiveNotFound, ArchiveStore, Query, em_of, find_archive, latest_only
from searchr1.viewer.turns import Run, attach_mask, blocks, highlight, mask_runs, token_cells
from tests.support.archive_fixture import write_archive

NO_CACHE = ViewerSettings(cache_dir=None)
TEXT = ("<think>need it</think>\n<search>capital</search>\n\n<information>Doc 1(Title: \"Kenya\") capital "
        "Nairobi.\nDoc 2(Title: x) y\n</information>\n\n<answer>Nairobi</answer>")


def test_blocks_environment_and_docs():
    bs = blocks(TEXT)
    assert [(b.kind, b.env) for b in bs] == [("think", False), ("search", False), ("information", True),
                                              ("answer", False)]
    assert bs[2].docs == [("1", '"Kenya"', "capital Nairobi."), ("2", "x", "y")]
    invalid = blocks(f"<think>t</think>\n<search> broken{INVALID_ACTION_MESSAGE}<answer>a</answer>")
    assert [(b.kind, b.env) for b in invalid] == [("think", False), ("text", False), ("invalid", True),
                                                   ("answer", False)]  # the message's own tag names are not blocks
    cut = blocks(f"<think>t</think>\n<search> broken{INVALID_ACTION_MESSAGE[:40]}")  # cut at the token limit
    assert [(b.kind, b.env) for b in cut] == [("think", False), ("text", False), ("invalid", True)]
    assert cut[-1].text == INVALID_ACTION_MESSAGE[:40]


def test_mask_runs_and_attach():
    assert mask_runs([1, 1, 0, 1]) == [Run(True, 0, 2), Run(False, 2, 1), Run(True, 3, 1)]
    bs = blocks(TEXT)
    mask = [1, 1, 1, 0, 0, 1]
    assert attach_mask(bs, mask, [-1.0, -2.0, -3.0, 0.0, 0.0, -0.5])
    assert [(b.tokens, b.logprob_mean) for b in bs] == [(3, -2.0), (None, None), (2, None), (1, -0.5)]
    assert not attach_mask(blocks(TEXT), [1, 1, 1, 1], [0.0] * 4)  # one run for three stretches
    assert not attach_mask(blocks(TEXT), [0, 1, 1], [0.0] * 3)  # runs of the wrong kind


def test_highlight_escapes_and_marks_case_insensitively():
    out = highlight("<b>Paris</b> paris a+b", ["Paris", "a+b", " "])
    assert str(out) == ('&lt;b&gt;<mark class="gold">Paris</mark>&lt;/b&gt; <mark class="gold">paris</mark> '
                        '<mark class="gold">a+b</mark>')
    assert str(highlight("<x>", [])) == "&lt;x&gt;"


def test_token_cells_shade_by_logprob_policy_tokens_only():
    cells = token_cells([5, 6, 7], [1, 0, 1], [-5.0, 0.0, -20.0])
    assert [(c["text"], c["own"], c["shade"]) for c in cells] == [("5", True, 0.5), ("6", False, 0.0), ("7", True, 1.0)]
    assert token_cells([5], [1], [-1.0], ["hi\n"])[0]["text"] == "hi↵"


def test_line_plot_coordinates_marks_and_escaping():
    svg = line_plot("a<b", [(0, 0.0), (10, 1.0)], marks=[10, 99])
    assert 'points="44.0,128.0 290.0,22.0"' in svg  # left/bottom corner to right/top corner
    assert svg.count('class="mark"') == 1 and "a&lt;b" in svg
    assert "no data" in line_plot("x", [])


def _summary(**cols) -> pa.Table:
    base = {"step": [1, 1, 2, 2], "policy_version": [0, 0, 0, 1], "malformed": [False, True, False, False],
            "finish_reason": ["answer", "length", "answer", "answer"], "queries": [2, 0, 1, 0],
            "repeated_queries": [1, 0, 0, 0], "reward": [1.0, 0.0, 0.5, 0.5], "em": [1.0, 0.0, None, None],
            "num_searches": [2, 0, 1, 0], "response_tokens": [10, 20, 30, 50], "answer_words": [1, 0, 2, 2],
            "think_words": [3, 0, 4, 6]}
    base.update(cols)
    return pa.table(base)


def test_archive_series_hand_checked():
    s = archive_series(_summary())
    assert s["reward"] == [(1, 0.5), (2, 0.5)]
    assert s["exact match"] == [(1, 0.5)]  # step 2 has no EM component
    assert s["format valid"] == [(1, 0.5), (2, 1.0)]
    # step s trains on version s - 1: (0 + 0) / 2, (1 + 0) / 2
    assert s["staleness (versions)"] == [(1, 0.0), (2, 0.5)]
    assert s["repeated-query rate"] == [(1, 0.25), (2, 0.0)]  # (1/2 + 0) / 2
    assert s["truncated rate"] == [(1, 0.5), (2, 0.0)]
    assert s["response tokens"] == [(1, 15.0), (2, 40.0)]
    assert alarm_steps(s) == [1]  # truncated rate 0.5 > 0.3


def test_log_series_skips_non_finite_and_non_records():
    out = log_series([{"step": 1, "entropy": 1.5, "kl_loss": float("nan")}, {"step": "x"},
                      {"step": 2, "entropy": 1.0, "grad_norm": 3}])
    assert out == {"entropy": [(1, 1.5), (2, 1.0)], "grad norm": [(2, 3.0)]}


def test_em_of_reads_composite_keys():
    assert em_of({"format": 1.0, "searchr1_em_format.answer_correct": 1.0}) == 1.0
    assert em_of({"em": 0.0}) == 0.0 and em_of({"format": 1.0}) is None


def test_latest_only_keeps_the_highest_part():
    t = pa.table({"step": [1, 1, 2], "task_id": ["a", "a", "a"], "part": [0, 1, 1], "x": [10, 11, 12]})
    assert latest_only(t).column("x").to_pylist() == [11, 12]


def test_store_projection_filters_live_parts(tmp_path):
    d = write_archive(tmp_path / "archive", steps=4, groups_per_step=2, every_steps=2)
    assert find_archive(tmp_path) == d and find_archive(d) == d
    with pytest.raises(ArchiveNotFound):
        find_archive(tmp_path / "nothing-here")
    store = ArchiveStore(d)
    s = store.summary()
    assert s.num_rows == 32 and "response_text" not in s.column_names and "loss_mask" not in s.column_names
    assert store.select(Query(min_step=2, max_step=3)).num_rows == 16
    assert set(store.select(Query(finish_reason="answer")).column("finish_reason").to_pylist()) == {"answer"}
    hits = store.select(Query(text="KENYA"))
    assert hits.num_rows > 0 and all("Kenya" in q for q in hits.column("question").to_pylist())
    write_archive(d, steps=1, groups_per_step=2, every_steps=2, first_step=5, seed=3)  # a live run goes on
    assert store.summary().num_rows == 40
    rows = store.trajectories(0, 1, s.column("task_id")[0].as_py())
    assert [r["index"] for r in rows] == [0, 1, 2, 3] and rows[0]["loss_mask"]
    assert store.trajectories(99, 1, "x") == []


@pytest.fixture
def run(tmp_path):
    write_archive(tmp_path / "archive", steps=3, groups_per_step=2)
    return tmp_path


def test_app_pages_and_bad_input(run):
    c = TestClient(create_app(run, NO_CACHE))
    assert c.get("/").status_code == 200
    for url, status, text in (("/?min_step=abc", 400, "min_step"), ("/?page=0", 400, "page"),
                              ("/trajectory?part=0&step=1", 400, "required"),
                              ("/trajectory?part=0&step=1&task_id=nope&index=0", 404, "no trajectory"),
                              ("/trajectory?part=0&step=1&task_id=q4&index=0&src=compare", 400, "compare"),
                              ("/question", 400, "task_id"), ("/question?task_id=nope", 404, "nope")):
        r = c.get(url)
        assert (r.status_code, text in r.text) == (status, True), url
    page = c.get("/?max_step=1&page=1").text
    assert "8 matching" in page


def test_app_token_header_cookie_and_open_health(run):
    c = TestClient(create_app(run, ViewerSettings(token="t0k", cache_dir=None)), follow_redirects=False)
    assert c.get("/").status_code == 401
    assert c.get("/healthz").status_code == 200
    assert c.get("/", headers={"Authorization": "Bearer t0k"}).status_code == 200
    assert c.get("/?token=bad").status_code == 401
    r = c.get("/?token=t0k&min_step=2")
    assert r.status_code == 303 and r.headers["location"] == "/?min_step=2"
    assert "HttpOnly" in r.headers["set-cookie"]
    assert c.get("/?min_step=2").status_code == 200  # the cookie now carries the token


def test_cli_view_registered_and_rejects_a_dir_without_parts(tmp_path):
    runner = CliRunner()
    r = runner.invoke(build_app(), ["view", "--help"], env={**os.environ, "COLUMNS": "200"})
    assert r.exit_code == 0 and "Run directory (holding archive/)" in r.output
    r = runner.invoke(build_app(), ["view", str(tmp_path)], env={**os.environ, "COLUMNS": "200"})
    assert r.exit_code == 2 and "no archive parts" in r.output


def test_step_log_is_plotted(run):
    (run / "learner").mkdir()
    events = [{"step": 2, "event": "guard_rollback", "first_bad_step": 1, "reasons": ["kl_loss 5 > 0.5"],
               "checkpoint": "step00000000", "lr": 5e-4}, {"step": 3, "event": "guard_stop", "first_bad_step": 3,
                                                            "reasons": ["kl_loss 1 > 0.5"]}]
    (run / "learner" / "r.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"step": 1, "entropy": 0.7}, *events)) + "\nnot json\n")
    page = TestClient(create_app(run, NO_CACHE)).get("/").text
    assert 'aria-label="entropy"' in page and "are not plotted" not in page
    assert "step 2: collapse guard rolled back to step00000000, learning rate 0.0005" in page
    assert "step 3: collapse guard stopped the learner (unhealthy since step 3: kl_loss 1 &gt; 0.5)" in page


def test_summary_cache_on_disk_reused_and_refreshed(tmp_path, monkeypatch):
    d = write_archive(tmp_path / "archive", steps=2, groups_per_step=2, every_steps=1)
    cache = tmp_path / "cache"
    first = ArchiveStore(d, cache).summary()
    assert len(list(cache.glob("*.arrow"))) == 2
    calls = []
    real = store_module.summarize_part
    monkeypatch.setattr(store_module, "summarize_part", lambda p, seq: calls.append(p) or real(p, seq))
    again = ArchiveStore(d, cache).summary()
    assert again.equals(first) and calls == []  # both parts from the cache
    write_archive(d, steps=1, groups_per_step=2, every_steps=1, first_step=3)  # a new part
    assert ArchiveStore(d, cache).summary().num_rows == 24 and [p.name for p in calls] == ["part-000002.parquet"]
    assert len(list(cache.glob("*.arrow"))) == 3


def test_trajectory_masked_whole_is_flagged(tmp_path):
    import random

    from searchr1.learner.tools.archive import ArchiveWriter
    from tests.support.archive_fixture import group

    g = group(1, 0, rng=random.Random(1), size=2)
    t = g.trajectories[0]
    g.trajectories[0] = t.model_copy(update={"loss_mask": [0] * len(t.loss_mask),
                                             "behavior_logprobs": [0.0] * len(t.loss_mask)})
    ArchiveWriter(tmp_path / "archive", every_steps=1).append(1, [g], ["1-0"])
    c = TestClient(create_app(tmp_path, NO_CACHE))
    page = c.get(f"/trajectory?part=0&step=1&task_id={g.task.task_id}&index=0").text
    assert 'id="mask-all-zero"' in page and 'id="mask-aligned"' not in page
    assert 'id="mask-aligned"' in c.get(f"/trajectory?part=0&step=1&task_id={g.task.task_id}&index=1").text


def test_the_validation_curve_is_plotted(tmp_path):
    from searchr1.viewer.series import validation_series

    write_archive(tmp_path / "archive", steps=4, groups_per_step=2)
    lines = [{"step": 0, "searchr1_em": 0.2, "em": 0.25, "cover_em": 0.3, "f1": 0.35, "outcome": "ok"},
             {"step": 2, "searchr1_em": 0.4, "em": 0.45, "cover_em": 0.5, "f1": 0.55, "outcome": "ok"},
             {"step": 4, "outcome": "failed", "exit_code": 1}]
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + "not json\n")
    series = validation_series(lines)
    assert series["validation: Search-R1 EM"] == [(0, 0.2), (2, 0.4)] and series["validation: F1"][-1] == (2, 0.55)
    page = TestClient(create_app(tmp_path, NO_CACHE)).get("/").text
    assert 'aria-label="validation: Search-R1 EM"' in page and 'aria-label="validation: cover EM"' in page


def test_ask_only_viewer_and_its_bad_input():
    class Asker:
        async def ask(self, question):
            class R:
                def to_json(self):
                    return {"question": question, "answer": "Paris", "response": "<think> t </think>\n<answer> Paris "
                            "</answer>", "finish_reason": "answer", "num_turns": 1, "num_searches": 0,
                            "generated_tokens": 9, "error": None}
            return R()

    c = TestClient(create_app(None, NO_CACHE, asker=Asker(), ask_info={"model": "m"}), follow_redirects=False)
    assert c.get("/").status_code == 303 and c.get("/").headers["location"] == "/ask"
    page = c.get("/ask?q=capital+of+france&gold=Paris").text
    assert 'id="verdict">correct' in page and 'data-kind="answer"' in page
    assert c.get("/ask?q=" + "x" * 4001).status_code == 400
    assert c.get("/trajectory?part=0&step=1&task_id=q&index=0").status_code == 404
    with pytest.raises(ArchiveNotFound):
        create_app(None, NO_CACHE)
