"""The simulator's GPU arithmetic on the recipes' shapes (hand-computed parameter counts, KV bytes, decode
and learner rates), the layouts a sizing tries and how it picks, a calibration from a run record whose
prediction is worked out by hand, and the `searchr1 plan` commands' answers to bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from searchr1.simulator.calibrate import CalibrationError, check_record, records
from searchr1.simulator.gpu import (
    H100,
    QWEN25_3B,
    QWEN25_7B,
    Efficiency,
    decode_iteration,
    learner_s_per_token,
    min_learner_gpus,
)
from searchr1.simulator.sizing import Layout, Row, best, layouts, recipe_from_config, shape_of

ROOT = Path(__file__).resolve().parents[2]


def test_qwen_shapes_by_hand():
    # per layer: q, o 2·2048²; k, v 2·2048·256; gate, up, down 3·2048·11008; ×36, + the tied LM head
    assert QWEN25_3B.flops_params == 36 * (2 * 2048**2 + 2 * 2048 * 256 + 3 * 2048 * 11008) + 2048 * 151_936
    assert QWEN25_3B.flops_params == 3_085_697_024 and QWEN25_3B.params == QWEN25_3B.flops_params
    assert QWEN25_3B.kv_bytes_per_token == 2 * 36 * 2 * 2 * 128
    assert QWEN25_7B.params == QWEN25_7B.flops_params + 3584 * 152_064  # untied embedding
    assert min_learner_gpus(QWEN25_3B, H100) == 1 and min_learner_gpus(QWEN25_7B, H100) == 3
    assert shape_of("models/Qwen2.5-7B-Instruct") is QWEN25_7B
    with pytest.raises(ValueError, match="no GPU shape"):
        shape_of("models/gpt2")


def test_decode_and_learner_rates_by_hand():
    eff = Efficiency()
    it = decode_iteration(QWEN25_3B, H100, eff, context=1000)
    bw, flops = 3.35e12 * 0.6, 989e12 * 0.5
    assert it.base_s == pytest.approx(2 * 3_085_697_024 / bw)
    assert it.per_seq_s == pytest.approx(1000 * 36_864 / bw + (2 * 3_085_697_024 + 4 * 36 * 2048 * 1000) / flops)
    one = learner_s_per_token(QWEN25_3B, H100, eff, 1, context=0, old_logprobs=False)
    assert one == pytest.approx(8 * 3_085_697_024 / (989e12 * 0.285))
    four = learner_s_per_token(QWEN25_3B, H100, eff, 4, context=0, old_logprobs=True)
    assert four == pytest.approx(10 * 3_085_697_024 / (989e12 * 0.285 * 4 * 0.9))


def test_layouts_leave_the_learner_its_gpus_and_best_prefers_less_staleness():
    r3, r7 = (recipe_from_config(ROOT / f"configs/searchr1-{m}-grpo.toml") for m in ("3b", "7b"))
    assert r3.groups_per_step == 512 and r3.group_size == 5 and r3.max_concurrent == 64 and r3.old_logprobs
    lay3, lay7 = layouts(r3, 8, H100), layouts(r7, 8, H100)
    assert len(lay3) == 1 + 7 * 3 and lay3[0].colocated
    assert min(lay.learner_gpus for lay in lay7 if not lay.colocated) == 3 and len(lay7) == 1 + 5 * 3
    rows = [Row(Layout(4, 4, 2), 10.0, 0.1, 1.5, 0), Row(Layout(4, 4, 1), 10.1, 0.2, 0.8, 0),
            Row(Layout(8, 8, 0, True), 12.0, 0.0, 0.0, 0)]
    assert best(rows).layout == Layout(4, 4, 1)  # within 2 % of the fastest, less stale
    assert Layout(8, 8, 0, True).gpus == 8 and Layout(3, 5, 2).describe() == "3 rollout + 5 learner, k = 2"


def _record(tmp_path: Path) -> dict:
    run = tmp_path / "lockstep"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({
        "learner": {"batch": {"groups_per_step": 1}, "dispatcher": {"group_size": 1},
                    "algorithm": {"max_staleness": 0}},
        "rollout": {"tasks": {"max_concurrent": 1}, "agent": {"max_turns": 4}}}))
    stage = {"forward_backward": 3.0, "optimizer": 0.0, "checkpoint": 0.1, "archive": 0.0, "other": 0.1,
             "weight_publish": 0.05, "queue_wait": 1.5}
    steps = [{"step": i + 1, "time": 100.0 + 5.0 * (i + 1), "tokens": 150.0, "stage_seconds": stage}
             for i in range(3)]
    zero = {"searchr1_rollout_turns_count": 0.0, "searchr1_rollout_groups_total": 0.0}
    last = {"searchr1_rollout_turns_count": 3.0, "searchr1_rollout_searches_sum": 0.0,
            "searchr1_rollout_groups_total": 3.0, "searchr1_rollout_weight_reload_seconds_sum": 1.0,
            "searchr1_rollout_weight_reload_seconds_count": 2.0}
    scrapes = [{"t": 100.0, "generated_tokens": 0.0, "stages": {"learner": {}, "rollout-0": {}},
                "counters": {"rollout-0": zero}},
               {"t": 115.0, "generated_tokens": 300.0, "counters": {"rollout-0": last},
                "stages": {"learner": {}, "rollout-0": {"generation": 3.0, "scoring": 0.15, "publish": 0.15,
                                                        "weight_reload": 1.0, "queue_wait": 10.7}}}]
    return {"variant": {"name": "lockstep"}, "run_dir": str(run), "t_up": 100.0, "steps": steps,
            "scrapes": scrapes, "load": [[110.0, 2.0]]}


def test_calibration_reads_the_clocks_and_predicts_by_hand(tmp_path):
    c = check_record(_record(tmp_path), seeds=1, length_cv=0.0)
    m = c.measured
    assert m.s_per_generated_token == pytest.approx(0.01) and m.s_per_trained_token == pytest.approx(0.02)
    assert m.times.reload_s == pytest.approx(0.5) and m.times.group_s == pytest.approx(0.1)
    assert m.times.overhead_s == pytest.approx(0.2) and m.wall_s == pytest.approx(15.0) and m.load == 2.0
    # step 1: 1 s generating + 0.1 s scoring/publishing + 3 s training + 0.2 + 0.05; steps 2, 3: + 0.5 s reload
    assert c.predicted.step_end_s == pytest.approx([4.35, 9.2, 14.05])
    assert c.error == pytest.approx(14.05 / 15.0 - 1) and c.ok


def test_records_without_counters_or_steps_are_named(tmp_path):
    rec = _record(tmp_path)
    rec["scrapes"][-1]["counters"] = {}
    with pytest.raises(CalibrationError, match="no rollout counters"):
        check_record(rec)
    rec["steps"] = []
    with pytest.raises(CalibrationError, match="no step was trained"):
        check_record(rec)
    with pytest.raises(CalibrationError, match="no records.json"):
        records(tmp_path)


def test_plan_commands_answer_bad_input_with_one_line(tmp_path):
    from searchr1.cli import build_app

    runner = CliRunner()
    app = build_app()
    out = runner.invoke(app, ["plan", "check", str(tmp_path)])
    assert out.exit_code != 0 and "no records.json" in out.output and "Traceback" not in out.output
    out = runner.invoke(app, ["plan", "simulate", "--config", "configs/searchr1-3b-grpo.toml", "--gpu", "tpu"])
    assert out.exit_code != 0 and "--gpu must be one of" in out.output
    out = runner.invoke(app, ["plan", "simulate", "--config", "configs/searchr1-3b-grpo.toml", "--gpus", "x"])
    assert out.exit_code != 0 and "GPU counts" in out.output


def test_sizing_a_small_recipe_tries_colocated_and_splits():
    from dataclasses import replace

    from searchr1.simulator.sizing import Assumptions, size

    r = replace(recipe_from_config(ROOT / "configs/searchr1-3b-grpo.toml"), groups_per_step=8, group_size=2,
                max_concurrent=4)
    chosen, colocated, rows = size(r, 4, H100, a=Assumptions(), steps=2)
    assert colocated.layout.colocated and any(not row.layout.colocated for row in rows)
    assert chosen.steps_per_hour >= 0.98 * max(row.steps_per_hour for row in rows)
    assert all(0.0 <= row.idle_share <= 1.0 for row in rows)
    with pytest.raises(ValueError, match="needs 3"):
        size(replace(r, shape=QWEN25_7B), 2, H100, steps=2)
