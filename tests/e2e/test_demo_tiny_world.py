"""The whole pipeline through the real services, and the learning claim: `searchr1 demo` on
configs/tiny-cpu-no-cost.toml — `make demo`'s config without the search cost — shortened to STEPS GRPO steps and a 6-question
evaluation. It builds world seed 0, starts from the committed warm start, evaluates it with the real
retriever + reward service + vLLM, trains under `searchr1 up` (Redis, retriever, reward, a vLLM rollout
worker, the learner), evaluates the last snapshot and writes the report.

The assertion that matters: the mean training reward of the last 20 of STEPS = 60 steps beats the first
20 by MARGIN. Sizing (docs/world.md, "The e2e test's margin"): the learning rate is constant, so these 60
steps are the first 60 of a run of that config with the same seeds; over its seeds 0, 1, 2 the gain was
0.139, 0.123 and 0.174 (per-step reward sd ~0.095, so the difference of two 20-step means has
sd ~0.03). MARGIN 0.04 is 2.8 of those sd below the smallest gain, and 1.3 above zero. In bf16 (bf16
compute over fp32 masters, a bf16 engine) the same sizing gave 0.110, 0.157 and 0.230: 2.3 sd above MARGIN. Only the step
count, the paths and the evaluation size differ from the committed config (seeds stay 0), and each
substitution is checked so that a change to the config cannot silently detach this test from it.

Not a timed test: it takes a few minutes (three vLLM start-ups and STEPS steps)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "tiny-cpu-no-cost.toml"
WARMSTART = ROOT / "assets" / "tiny-world" / "warmstart"
STEPS = 60
WINDOW = 20
MARGIN = 0.04
SHORT_STEPS = 4


def shortened_config(root: Path, steps: int = STEPS, dtype: str = "float32") -> str:
    """configs/tiny-cpu-no-cost.toml with paths under `root`, `steps` GRPO steps and a small evaluation; with
    `dtype` bfloat16, the learner computes in bf16 over its fp32 masters and the engine runs in bf16."""
    text = CONFIG.read_text()
    swaps = [
        ('run = "tiny-cpu-no-cost"', 'run = "e2e"'),
        ('"runs/tiny-cpu-no-cost', f'"{root}/run'),
        ('"runs/world', f'"{root}/world'),
        ('"assets/tiny-world/warmstart"', f'"{WARMSTART}"'),
        ("total_steps = 150", f"total_steps = {steps}"),
        ('eval_args = ["--samples", "4"]', 'eval_args = ["--samples", "1", "--limit", "6"]'),
    ]
    if dtype != "float32":
        swaps += [('dtype = "float32"', f'dtype = "{dtype}"'),
                  ('[learner.model]\n', f'[learner.model]\ndtype = "{dtype}"\n')]
    for old, new in swaps:
        assert old in text, f"configs/tiny-cpu-no-cost.toml no longer holds {old!r}: update this test with it"
        text = text.replace(old, new)
    return text


@pytest.mark.release
@pytest.mark.timeout(2400)  # 10 min on 2 cores (5.9 s/step); shared cores can double it
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_demo_learns_through_the_real_services(tmp_path, dtype):
    """`dtype` float32 as `make demo` runs; bfloat16 as the recipe runs (bf16 compute over fp32 masters, a
    bf16 engine), sized the same way (docs/world.md, "The e2e test's margin")."""
    cfg = tmp_path / "e2e.toml"
    cfg.write_text(shortened_config(tmp_path, dtype=dtype))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "searchr1.cli", "demo", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=2300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    run = tmp_path / "run"

    # the world was built (seed 0: the one whose known entities the committed warm start memorised)
    manifest = json.loads((tmp_path / "world" / "manifest.json").read_text())
    assert manifest["seed"] == 0
    assert "warm start: cached" in out

    # both evaluations ran through the retriever and reward service
    for name in ("eval-before", "eval-after"):
        doc = json.loads((run / name / "eval.json").read_text())
        assert {"greedy", "sampled"} <= set(doc["summary"]), name
        assert doc["summary"]["greedy"]["overall"]["questions"] == 6
        assert len(doc["records"]) == 12  # 6 questions × (greedy + 1 sample)

    # training: every step logged on fresh groups, weights published, the final model assembled
    steps = [json.loads(line) for line in (run / "learner" / "e2e.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["trajectories"] > 0 and s["by_source"] for s in steps), steps
    assert (run / "weights" / f"v{STEPS:08d}").is_dir()
    assert (run / "final-model" / "tokenizer.json").is_file()
    # versions in the engine's dtype, every one of them moving what the engine loads
    header = (run / "weights" / f"v{STEPS:08d}" / "model.safetensors").read_bytes()
    meta = json.loads(header[8:8 + int.from_bytes(header[:8], "little")])
    assert {v["dtype"] for k, v in meta.items() if k != "__metadata__"} == {"F32" if dtype == "float32" else "BF16"}
    assert all(s["published_changed_frac"] > 0 for s in steps[1:]), [s.get("published_changed_frac") for s in steps]

    # the learning claim
    rewards = [s["reward_mean"] for s in steps]
    first, last = statistics.mean(rewards[:WINDOW]), statistics.mean(rewards[-WINDOW:])
    assert last - first > MARGIN, f"reward first {WINDOW} steps {first:.3f}, last {WINDOW} {last:.3f}: {rewards}"
    # the KL to the reference stays bounded on the way
    assert max(s["kl_loss"] for s in steps) < 0.5, [s["kl_loss"] for s in steps]

    # the report and the one-screen summary
    report = (run / "report.md").read_text()
    assert "| sampled EM |" in report and (run / "report.png").stat().st_size > 1000
    assert f"training: {STEPS} steps" in out
    for name in ("retriever", "reward", "rollout-0", "learner", "redis"):
        assert (run / "logs" / f"{name}.log").is_file(), name
    assert_no_traceback(out, run / "logs")


def assert_no_traceback(console: str, log_dir: Path) -> None:
    """A finished run stops every process cleanly: no traceback and no ERROR line on the console or in
    any process's log (a stopped worker closes its own engine, so no call fails under it)."""
    places = {"console": console, **{p.name: p.read_text(errors="replace") for p in sorted(log_dir.glob("*.log"))}}
    for where, text in places.items():
        bad = [line for line in text.splitlines() if "Traceback (most recent call last)" in line or " ERROR " in line]
        assert not bad, f"{where}: {bad[:5]}"


@pytest.mark.release
@pytest.mark.timeout(1800)
def test_a_finished_demo_leaves_no_traceback(tmp_path):
    """A short demo (SHORT_STEPS steps): when the learner finishes, the launcher stops the rollout worker
    with its vLLM engine, and neither the console nor any log carries a traceback."""
    cfg = tmp_path / "short.toml"
    cfg.write_text(shortened_config(tmp_path, steps=SHORT_STEPS))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "searchr1.cli", "demo", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=1700, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert_no_traceback(out, tmp_path / "run" / "logs")
