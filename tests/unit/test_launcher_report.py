"""The demo report's pure parts: step-log curves split known/unknown, windows, eval comparison."""

from __future__ import annotations

import json

import pytest

from searchr1.launcher.report import (
    compare_evals,
    curves,
    load_steps,
    markdown,
    moving_average,
    split_of,
    summary_lines,
    windowed_mean,
    write_report,
)

STEPS = [
    {"step": 1, "reward_mean": 0.2, "em_mean": 0.2, "searches_per_trajectory": 1.0, "kl_loss": 0.0,
     "by_source": {"world_known_single_hop": {"trajectories": 8, "reward_mean": 0.5, "searches_per_trajectory": 1.0},
                   "world_unknown_single_hop": {"trajectories": 16, "reward_mean": 0.05, "searches_per_trajectory": 1.0},
                   "world_unknown_two_hop": {"trajectories": 8, "reward_mean": 0.2, "searches_per_trajectory": 2.0}}},
    {"step": 2, "reward_mean": 0.6, "searches_per_trajectory": 0.5, "kl_loss": 0.01, "by_source": {}},
    {"step": 3, "reward_mean": 0.7, "searches_per_trajectory": 0.5, "kl_loss": 0.02},
]


def test_split_of():
    assert split_of("world_known_single_hop") == "known"
    assert split_of("world_unknown_two_hop") == "unknown"
    assert split_of("nq") == "other"


def test_curves_weight_by_trajectories():
    c = curves(STEPS)
    assert c["all"]["reward_mean"] == [(1, 0.2), (2, 0.6), (3, 0.7)]
    assert c["all"]["em_mean"] == [(1, 0.2)]
    assert c["known"]["reward_mean"] == [(1, 0.5)]
    # (16 * 0.05 + 8 * 0.2) / 24 = 0.1 ; searches (16 * 1 + 8 * 2) / 24 = 4/3
    (step, value), = c["unknown"]["reward_mean"]
    assert step == 1 and value == pytest.approx(0.1)
    assert c["unknown"]["searches_per_trajectory"][0][1] == pytest.approx(4 / 3)


def test_windowed_mean():
    pts = [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)]
    assert windowed_mean(pts, True, 2) == 0.5
    assert windowed_mean(pts, False, 3) == 2.0
    assert windowed_mean([], True, 2) is None


def _eval(sampled_em, greedy_em, known_searches):
    return {"summary": {
        "sampled": {"overall": {"em": sampled_em, "format_valid": 1.0, "searches": 1.0},
                    "by": {"data_source": {
                        "world_known_single_hop": {"trajectories": 10, "em": 0.9, "searches": known_searches,
                                                   "searched": 0.5},
                        "world_unknown_single_hop": {"trajectories": 30, "em": 0.1, "searches": 1.0,
                                                     "searched": 1.0}}}},
        "greedy": {"overall": {"em": greedy_em}, "by": {}}}}


def test_moving_average_is_trailing():
    pts = [(1, 1.0), (2, 3.0), (5, 5.0), (6, 7.0)]
    assert moving_average(pts, 2) == [(1, 1.0), (2, 2.0), (5, 4.0), (6, 6.0)]
    assert moving_average(pts, 10) == [(1, 1.0), (2, 2.0), (5, 3.0), (6, 4.0)]
    assert moving_average(pts, 1) == pts and moving_average([], 3) == []
    with pytest.raises(ValueError):
        moving_average(pts, 0)


def test_compare_evals_rows_and_deltas():
    rows = {r["name"]: r for r in compare_evals(_eval(0.3, 0.8, 1.0), _eval(0.45, 0.8, 0.2))}
    assert rows["sampled EM"]["delta"] == pytest.approx(0.15)
    assert rows["greedy EM"]["delta"] == 0.0
    assert rows["sampled searches/question, known"]["before"] == 1.0
    assert rows["sampled searches/question, known"]["after"] == pytest.approx(0.2)
    assert rows["sampled EM, unknown entities"]["after"] == pytest.approx(0.1)
    none = {r["name"]: r for r in compare_evals(None, _eval(0.1, 0.1, 0.0))}
    assert none["sampled EM"]["before"] is None and none["sampled EM"]["delta"] is None


def test_summary_and_markdown(tmp_path):
    rows = compare_evals(_eval(0.3, 0.8, 1.0), _eval(0.45, 0.8, 0.2))
    lines = summary_lines(rows, STEPS, window=1)
    assert "sampled EM" in lines[1] and "+0.150" in lines[1]
    assert lines[-1] == "training: 3 steps; mean reward first 1 0.200 → last 1 0.700; max KL 0.0200"
    md = markdown(rows, STEPS, {"config": "x"}, "report.png")
    assert "| sampled EM | 0.300 | 0.450 | +0.150 |" in md and "report.png" in md
    log = tmp_path / "steps.jsonl"
    log.write_text("\n".join(json.dumps(s) for s in STEPS) + "\nnot json\n")
    assert [s["step"] for s in load_steps(log)] == [1, 2, 3]
    assert load_steps(tmp_path / "missing.jsonl") == []
    report, summary = write_report(tmp_path / "run", log, _eval(0.3, 0.8, 1.0), _eval(0.45, 0.8, 0.2), {"k": "v"})
    assert report.read_text().startswith("# searchr1 demo report")
    assert (tmp_path / "run" / "report.png").stat().st_size > 1000
    assert json.loads((tmp_path / "run" / "report.json").read_text())["compare"][0]["name"] == "sampled EM"
