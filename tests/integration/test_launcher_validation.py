"""Validation during training (`searchr1.launcher.validation`): the versions the learner publishes are staged
as they appear (the newest full at or before each and the deltas after it, hard-linked) and evaluated in
order — step 0 when asked, the due versions, the last version when training ends — by stand-ins of
`searchr1 weights export` (a script that makes the model folder) and `searchr1 eval` (one that writes an
eval.json whose score is the version / 10); the curve goes to validation.jsonl, the Prometheus gauges,
TensorBoard event files and an offline W&B run. A slow test runs the whole thing under `searchr1 up` with the
real retriever, reward service, exporter and `searchr1 eval` (transformers engine on the tiny-world warm
start) while snapshots the learner's publisher wrote appear."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from searchr1.launcher.settings import ValidationSettings
from searchr1.launcher.validation import Validator, published_versions, stage_chain, stage_model
from tests.conftest import WARMSTART

FAKE_EXPORT = r'''
import shutil, sys
from pathlib import Path
chain, version, model = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
model.mkdir(parents=True)
for name in ("config.json", "model.safetensors"):
    shutil.copy2(chain / f"v{version:08d}" / name, model / name)
shutil.copy2(Path(sys.argv[4]) / "tokenizer.json", model / "tokenizer.json")
'''

FAKE_EVAL = r'''
import json, sys
from pathlib import Path
model, out = Path(sys.argv[1]), Path(sys.argv[2])
cfg = json.loads((model / "config.json").read_text())
score = cfg.get("fake_version", 0) / 10
assert (model / "tokenizer.json").is_file() and (model / "model.safetensors").is_file()
g = {"questions": 4, "trajectories": 4, "searchr1_em": score, "em": score, "cover_em": score, "f1": score,
     "format_valid": 1.0, "searches": 1.0, "failed_searches": 0, "failed_scores": 0, "failure_rate": 0.0}
out.mkdir(parents=True, exist_ok=True)
(out / "eval.json").write_text(json.dumps({"meta": {"fingerprint": {"id": "ab" * 32}},
                                           "summary": {"greedy": {"overall": g, "by": {}}}}))
'''


def _publish(weights: Path, version: int) -> None:
    """A snapshot in the publisher's layout (renamed into place when complete): the warm start's weights."""
    tmp = weights / f".tmp-v{version:08d}"
    tmp.mkdir(parents=True)
    (tmp / "generation_config.json").write_bytes((WARMSTART / "generation_config.json").read_bytes())
    cfg = json.loads((WARMSTART / "config.json").read_text())
    (tmp / "config.json").write_text(json.dumps({**cfg, "fake_version": version}))
    (tmp / "model.safetensors").write_bytes((WARMSTART / "model.safetensors").read_bytes())
    (tmp / "snapshot.manifest.json").write_text("{}")
    tmp.rename(weights / f"v{version:08d}")


def test_a_version_is_staged_with_the_full_and_deltas_it_is_rebuilt_from(tmp_path):
    weights = tmp_path / "weights"
    for name, file in (("v00000002", "model.safetensors"), ("d00000003", "model.delta"), ("d00000004", "model.delta"),
                       ("v00000004", "model.safetensors")):
        (weights / name).mkdir(parents=True)
        (weights / name / file).write_bytes(name.encode())
    (weights / ".tmp-v00000005").mkdir()  # being written: not a version yet
    assert published_versions(weights) == [2, 3, 4]
    chain = stage_chain(weights, 3, tmp_path / "s3")
    assert sorted(p.name for p in chain.iterdir()) == ["d00000003", "v00000002"]
    assert (chain / "d00000003" / "model.delta").stat().st_ino == (weights / "d00000003" / "model.delta").stat().st_ino
    assert sorted(p.name for p in stage_chain(weights, 4, tmp_path / "s4").iterdir()) == ["v00000004"]
    shutil.rmtree(weights / "v00000002")  # pruned: 3 can no longer be rebuilt
    with pytest.raises(OSError, match="no full version at or before 3"):
        stage_chain(weights, 3, tmp_path / "s3b")


def _publish_real(weights: Path, versions) -> None:
    """Snapshots through the learner's own publisher (config, weights, manifest): the warm start's weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from searchr1.weightsync import WeightPublisher

    model = AutoModelForCausalLM.from_pretrained(WARMSTART, dtype=torch.float32)
    pub = WeightPublisher(weights, keep=3)
    for v in versions:
        pub.write(v, model, model.state_dict())


def test_staging_links_the_snapshot_and_copies_the_tokenizer(tmp_path):
    _publish(tmp_path / "weights", 3)
    assert published_versions(tmp_path / "weights") == [3]
    out = stage_model(WARMSTART, tmp_path / "weights" / "v00000003", tmp_path / "staged")
    assert (out / "tokenizer.json").read_bytes() == (WARMSTART / "tokenizer.json").read_bytes()
    assert json.loads((out / "config.json").read_text())["fake_version"] == 3
    assert (out / "model.safetensors").stat().st_ino == (tmp_path / "weights" / "v00000003" / "model.safetensors").stat().st_ino
    assert not (out / "snapshot.manifest.json").exists()
    shutil.rmtree(tmp_path / "weights")  # the learner prunes it: the staged copy stays whole
    assert (out / "model.safetensors").stat().st_size > 0


async def test_due_versions_the_curve_gauges_tensorboard_and_wandb(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    from searchr1.launcher.metrics import ValidationMetrics
    from searchr1.launcher.validation_setup import trackers_for

    monkeypatch.setenv("WANDB_SILENT", "true")
    script = tmp_path / "fake_eval.py"
    script.write_text(FAKE_EVAL)
    exporter = tmp_path / "fake_export.py"
    exporter.write_text(FAKE_EXPORT)
    run_dir, weights = tmp_path / "run", tmp_path / "run" / "weights"
    weights.mkdir(parents=True)
    settings = ValidationSettings(eval_every=2, eval_before_train=True, data="unused", poll_interval_s=0.05,
                                  tensorboard_dir="{run_dir}/tb", wandb_project="searchr1-test", wandb_mode="offline")
    said: list[str] = []
    metrics = ValidationMetrics.create()
    v = Validator(settings, run_dir=run_dir, weights_dir=weights, base_model=WARMSTART,
                  command=lambda model, out: [sys.executable, str(script), str(model), str(out)],
                  export_command=lambda chain, v, model: [sys.executable, str(exporter), str(chain), str(v), str(model),
                                                          str(WARMSTART)],
                  env={}, say=lambda m, style: said.append(m), metrics=metrics,
                  trackers=trackers_for(settings, "r", run_dir), metrics_port=0)
    v.start()
    try:
        for version in (1, 2, 3, 4, 5):
            _publish(weights, version)
            await asyncio.sleep(0.1)
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{v._server.port}/metrics", timeout=10).read().decode())
        assert "searchr1_validation_runs_total" in body
        await v.finish()  # the learner is done: 5 is validated too (eval_after_train)
    finally:
        await v.stop()
    records = [json.loads(line) for line in (run_dir / "validation.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2, 4, 5]
    assert [r["searchr1_em"] for r in records] == [0.0, 0.2, 0.4, 0.5]
    assert all(r["outcome"] == "ok" and r["fingerprint"] == "ab" * 32 and r["questions"] == 4 for r in records)
    assert metrics.score.labels("searchr1_em")._value.get() == 0.5 and metrics.step._value.get() == 5
    assert metrics.runs.labels("ok")._value.get() == 4
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    points = [(e.step, round(float(tensor_util.make_ndarray(e.tensor_proto)), 3))
              for e in acc.Tensors("validation/searchr1_em")]
    assert points == [(0, 0.0), (2, 0.2), (4, 0.4), (5, 0.5)]
    offline = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0
    assert any("validation, step 4: Search-R1 EM 0.400" in m for m in said)
    assert not list((run_dir / "validation").glob("*/model")) and not list((run_dir / "validation").glob("*/chain"))
    assert (run_dir / "validation" / "v00000004" / "eval.json").is_file()  # the staged weights go, the reports stay


async def test_a_failed_validation_is_recorded_not_fatal(tmp_path):
    run_dir, weights = tmp_path / "run", tmp_path / "run" / "weights"
    weights.mkdir(parents=True)
    _publish(weights, 1)
    settings = ValidationSettings(eval_every=1, data="unused", poll_interval_s=0.05)
    v = Validator(settings, run_dir=run_dir, weights_dir=weights, base_model=WARMSTART,
                  command=lambda model, out: [sys.executable, "-c", "import sys; sys.exit(3)"],
                  export_command=lambda chain, v, model: [sys.executable, "-c", "pass"], env={},
                  say=lambda m, style: None)
    v.start()
    try:
        await v.finish()
    finally:
        await v.stop()
    (record,) = [json.loads(line) for line in (run_dir / "validation.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["outcome"] == "failed" and record["exit_code"] == 3


@pytest.mark.slow
def test_validation_under_searchr1_up(tmp_path, tiny_world):
    """`searchr1 up` with the real retriever and reward, `searchr1 eval` on the transformers engine, and the
    stand-in learner of test_launcher_up (exit 0 after 25 s) while versions 1 and 2 appear in its weights
    directory: steps 0, 1 and 2 are validated and recorded, the gauges served while it runs."""
    import subprocess

    from test_launcher_up import FAKE_SERVICE, finish, wait_for

    world, _, _ = tiny_world
    fake = tmp_path / "fake_service.py"
    fake.write_text(FAKE_SERVICE)
    data = tmp_path / "held-out.jsonl"
    data.write_text("".join((world / "tasks-test.jsonl").read_text().splitlines(keepends=True)[:2]))
    cfg = tmp_path / "run.toml"
    cfg.write_text(textwrap.dedent(f"""
        [launcher]
        run = "val"
        commands.learner = {json.dumps([sys.executable, str(fake)])}
        [launcher.learner]
        extra_args = ["--fake-exit-after", "25"]
        [launcher.retriever]
        index_dir = "{tmp_path / 'index'}"
        corpus = "{world / 'corpus.jsonl'}"
        [launcher.rollout]
        workers = 0
        [launcher.validation]
        eval_every = 1
        eval_before_train = true
        data = "{data}"
        [rollout]
        model = "{WARMSTART}"
        [rollout.engine]
        kind = "hf"
        [rollout.agent]
        max_turns = 2
        max_tokens_per_turn = 64
        [reward]
        workers = 1
        """))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "searchr1.launcher", "--config", str(cfg), "--run-dir",
                             str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env={**os.environ, "FAKE_RECORD_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: (tmp_path / "learner.json").exists()
                 and "healthy_at" in json.loads((tmp_path / "learner.json").read_text()), timeout=300,
                 what="the learner stand-in to be up")
        _publish_real(run_dir / "weights", (1, 2))
        connection = json.loads((run_dir / "connection.json").read_text())
        wait_for(lambda: (run_dir / "validation.jsonl").exists(), timeout=300, what="a first validation")
        body = urllib.request.urlopen(connection["validation_metrics"], timeout=10).read().decode()
        assert 'searchr1_validation_score{metric="searchr1_em"}' in body
        code, out = finish(proc, timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 0, out[-4000:]
    records = [json.loads(line) for line in (run_dir / "validation.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2], out[-4000:]
    assert all(r["outcome"] == "ok" and r["questions"] == 2 and r["failed"] == 0 for r in records), records
    assert records[0]["fingerprint"] and records[1]["searchr1_em"] is not None
    assert "validation, step 2: Search-R1 EM" in out
