"""benchmarks/learner.py --device cuda: its code path (bf16, FSDP2 on one device, gradient checkpointing,
top-k vs full-vocabulary KL) runs on CPU at a tiny shape, and its model-FLOPs count is right."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import learner_gpu  # noqa: E402


def test_model_flops_of_the_qwen25_3b_shape():
    # Per layer: q and o 2048² each, k and v 2048·256 each (2 of 16 heads), gate/up/down 3·2048·11008;
    # 36 layers + the tied LM head 2048·151,936 = 3,085,697,024 matmul parameters (2.77B non-embedding).
    n = 36 * (2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 11008) + 2048 * 151_936
    assert n == 3_085_697_024
    flops = learner_gpu.model_flops_per_token(learner_gpu.SHAPES["qwen2.5-3b"], 151_936, 2048)
    assert flops == 8 * n + 16 * 36 * 2048 * 2048 == 27_101_495_296


def test_gpu_path_runs_on_cpu_at_a_tiny_shape():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/learner.py"), "--device", "cpu", "--fsdp", "--shapes", "tiny",
         "--fsdp-batch", "1", "--fsdp-len", "48", "--fsdp-response", "16", "--fsdp-repeats", "1",
         "--kl-topk", "8"], capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "bf16 compute over fp32 masters, FSDP2 on one cpu device" in out and "gradient checkpointing on" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("tiny")]
    assert [r[1] for r in rows] == ["top-8", "full"], out
    for r in rows:
        # tokens/s, peak and KL-term MiB; the resident memory reads nan off CUDA
        assert float(r[-5]) > 0 and float(r[-3]) >= 0 and float(r[-2]) >= 0 and r[-1] == "nan", out
