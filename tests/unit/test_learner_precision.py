"""The learner's precision choice (`learner/train/precision.py`, `model.dtype`): what each setting stores
and computes in, a device without bf16 refused, and a float16 step (fp32 master weights, fp16 autocast
forward, loss scaling) that trains like the fp32 one."""

from __future__ import annotations

import random

import pytest
import torch
from pydantic import ValidationError

from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.precision import check_dtype, grad_scaler, stored_dtype
from searchr1.rollout.settings import EngineSettings

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_stored_dtypes():
    assert stored_dtype("float32", CPU) == torch.float32
    assert stored_dtype("bfloat16", CPU) == torch.bfloat16
    assert stored_dtype("float16", CPU) == torch.float32  # fp32 master weights
    assert stored_dtype("auto", CPU) == torch.float32
    assert grad_scaler("float16", CPU) is not None and grad_scaler("bfloat16", CPU) is None


def test_bf16_refused_on_a_gpu_without_it():
    with pytest.raises(ValueError, match="no bf16 support"):
        check_dtype("bfloat16", CUDA, bf16_supported=False)
    check_dtype("bfloat16", CUDA, bf16_supported=True)
    check_dtype("float16", CUDA, bf16_supported=False)
    with pytest.raises(ValueError, match="model.dtype must be one of"):
        check_dtype("float8", CPU)


def test_settings_on_both_sides_validate():
    assert LearnerSettings(model={"dtype": "float16"}).model.dtype == "float16"
    assert EngineSettings(dtype="float16").dtype == "float16"
    with pytest.raises(ValidationError):
        LearnerSettings(model={"dtype": "half"})
    with pytest.raises(ValidationError):
        EngineSettings(dtype="fp8")


def _step(model_path, dtype: str):
    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.model import DistInfo
    from tests.support.synthetic import synthetic_group

    torch.manual_seed(0)
    s = LearnerSettings(model={"path": str(model_path), "dtype": dtype}, device="cpu",
                        algorithm={"advantage": "grpo", "use_kl_loss": False, "entropy_coef": 0.0},
                        optim={"lr": 1e-3, "weight_decay": 0.0}, batch={"micro_batch_size": 16})
    training = build_training(s, DistInfo())
    batch = build_batch([synthetic_group("g", group_size=4, vocab=128, rng=random.Random(1), rewards=[1, 0, 1, 0])])
    before = {k: v.detach().clone() for k, v in training.trainer.policy.named_parameters()}
    figures = training.trainer.train_step(batch, version=0)
    after = dict(training.trainer.policy.named_parameters())
    return figures, {k: after[k].detach() - before[k] for k in before}, training.trainer


def test_a_float16_step_trains_like_float32(tmp_path):
    from tests.support.synthetic import tiny_qwen2

    model = tiny_qwen2(tmp_path / "m", vocab=128, hidden=64)
    f32, d32, _ = _step(model, "float32")
    f16, d16, trainer = _step(model, "float16")
    assert all(p.dtype == torch.float32 for p in trainer.policy.parameters())
    assert trainer.scaler is not None and trainer.scaler.get_scale() > 0
    # the fp16 forward is not the fp32 one (the log-probs differ in their low bits) ...
    assert f16["mismatch_abs_logp_mean"] != f32["mismatch_abs_logp_mean"]
    # ... but the update it makes is the same one, to fp16 precision
    num = sum(float((d16[k] - d32[k]).norm() ** 2) for k in d32) ** 0.5
    den = sum(float(d32[k].norm() ** 2) for k in d32) ** 0.5
    assert den > 0 and num / den < 0.05
    assert f16["loss"] == pytest.approx(f32["loss"], rel=0.02, abs=1e-3)
