"""Demo helpers: paths from the run config, the latest snapshot, assembling a loadable final model,
the eval plan (retriever + reward + one main `searchr1 eval`), and a one-shot stage's console: its
`[n/6]` line and its warnings, or every line with `verbose`; its log file keeps everything either way."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from searchr1.core.settings import load_settings
from searchr1.launcher.demo import (
    Demo,
    DemoError,
    assemble_model,
    has_weights,
    latest_snapshot,
    resolve_paths,
)
from searchr1.launcher.planner import build_plan
from searchr1.launcher.settings import LauncherSettings
from searchr1.launcher.specs import eval_plan


def _config(tmp_path, learner_weights: str | None = "w"):
    cfg = tmp_path / "run.toml"
    text = ('[launcher]\nrun = "r"\nrun_dir = "RUN"\n[launcher.retriever]\nindex_dir = "IDX"\n'
            '[launcher.rollout]\nenv = { VLLM_CPU_KVCACHE_SPACE = "1" }\n')
    if learner_weights:
        text += f'[learner.weights]\ndir = "{tmp_path / learner_weights}"\n'
    cfg.write_text(text)
    (tmp_path / "IDX").mkdir(exist_ok=True)
    return cfg


def test_resolve_paths_under_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path)
    s = load_settings(LauncherSettings, cfg)
    p = resolve_paths(s, cfg, None)
    assert p.weights == tmp_path / "RUN" / "weights" and p.run_dir == tmp_path / "RUN"
    assert p.steps_log == tmp_path / "RUN" / "learner" / "r.jsonl"
    assert p.eval_data == tmp_path / "runs" / "world" / "test.parquet"
    p2 = resolve_paths(s, cfg, tmp_path / "other")
    assert p2.weights == tmp_path / "other" / "weights"
    learner = next(sp for sp in build_plan(s, cfg, tmp_path / "other").specs if sp.name == "learner")
    assert learner.env["LEARNER_WEIGHTS__DIR"] == str(tmp_path / "other" / "weights")
    assert learner.env["LEARNER_CHECKPOINT__DIR"] == str(tmp_path / "other" / "checkpoints")


def _model(d, tag: bytes):
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(tag)
    return d


def test_latest_snapshot_and_assemble(tmp_path):
    w = tmp_path / "weights"
    assert latest_snapshot(w) is None
    _model(w / "v00000001", b"one")
    _model(w / "v00000010", b"ten")
    (w / "v00000011").mkdir()  # half-written: no weights
    (w / ".partial-v00000012").mkdir()
    assert latest_snapshot(w).name == "v00000010"
    warm = _model(tmp_path / "warm", b"warm")
    (warm / "tokenizer.json").write_text("tok")
    (warm / "model-00001-of-00002.safetensors").write_bytes(b"old shard")
    out = assemble_model(warm, w / "v00000010", tmp_path / "final")
    assert has_weights(out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (out / "model.safetensors").read_bytes() == b"ten"
    assert (warm / "model.safetensors").read_bytes() == b"warm"


def test_eval_plan_keeps_services_and_runs_eval_as_main(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path)
    s = load_settings(LauncherSettings, cfg)
    plan = eval_plan(build_plan(s, cfg), ["--model", "M", "--data", "D"])
    assert [sp.stage for sp in plan.specs] == ["retriever", "reward", "eval"]
    main = plan.specs[-1]
    assert main.main and main.gates == []
    token = plan.values["token"]  # the eval runs the rollout engine: same env, less Redis (it uses none)
    assert main.env == {"VLLM_CPU_KVCACHE_SPACE": "1", "ROLLOUT_RETRIEVER__TOKEN": token,
                        "ROLLOUT_REWARD__TOKEN": token, "ROLLOUT_WEIGHTS__TOKEN": token}
    argv = main.argv
    i = argv.index("eval")
    assert argv[i:i + 3] == ["eval", "--config", str(cfg.resolve())]
    assert argv[argv.index("--retriever") + 1] == plan.values["retriever_grpc"]
    assert argv[argv.index("--reward") + 1] == plan.values["reward_url"]
    assert argv[-4:] == ["--model", "M", "--data", "D"]


_STAGE_SCRIPT = """
import sys
print("2026-11-24 04:52:19,583 INFO vllm.config: noise", flush=True)
print("2026-11-24 04:52:19,584 WARNING searchr1.world: something to see", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[-1]))
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_a_stage_shows_its_line_and_keeps_its_output_in_the_log(tmp_path, monkeypatch, verbose):
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path)
    s = load_settings(LauncherSettings, cfg)
    script = tmp_path / "stage.py"
    script.write_text(_STAGE_SCRIPT)
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False, color_system=None)
    demo = Demo(s, cfg, resolve_paths(s, cfg, None), console, [sys.executable, str(script)], verbose=verbose)
    demo._run("world", "world-build", ["0"])
    out = buf.getvalue().splitlines()
    assert out[0].startswith("demo [1/6] world: searchr1 0  (log: ") and out[0].endswith("world-build.log)")
    warning = "world-build │ 2026-11-24 04:52:19,584 WARNING searchr1.world: something to see"
    assert out[1:] == (["world-build │ 2026-11-24 04:52:19,583 INFO vllm.config: noise", warning]
                       if verbose else [warning])
    log = (tmp_path / "RUN" / "logs" / "world-build.log").read_text()
    assert "INFO vllm.config: noise" in log and "WARNING searchr1.world: something to see" in log
    with pytest.raises(DemoError, match=r"^world-build failed with exit code 3 \(last lines above; all of them in "
                                         r".*world-build\.log\)$") as failed:
        demo._run("world", "world-build", ["3"])
    assert failed.value.code == 1 and any("something to see" in line for line in failed.value.tail)
