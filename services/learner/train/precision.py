"""The learner's numeric precision (`model.dtype`): what the parameters are stored in, what the forward
computes in, and whether the loss is scaled.

| `model.dtype` | parameters | forward | loss scaling | devices |
|---|---|---|---|---|
| `float32` | fp32 | fp32 | — | any |
| `bfloat16` | bf16 | bf16 | — | CPU; CUDA with bf16 support (Ampere and later) |
| `float16` | fp32 (master weights) | fp16 autocast | dynamic (`torch.amp.GradScaler`) | CUDA; CPU (slow, for tests) |
| `auto` | bf16 on CUDA, fp32 on CPU | as stored | — | any |

`float16` is the mixed-precision route that keeps the learner's forward in the engine's fp16 (an engine
in fp16 and a learner in fp16 agree on far more bits than both in bf16: 10 mantissa bits against 7),
while the optimizer updates fp32 weights; the snapshot the learner publishes is fp32 (the engine casts it
to its own `engine.dtype` on load). The rollout side's choice is `engine.dtype`; docs/learner.md, "Train–
inference mismatch", gives the measured gap of each pair.
"""

from __future__ import annotations

import contextlib

import torch

_STORED = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float32}


def check_dtype(setting: str, device: torch.device, *, bf16_supported: bool | None = None) -> None:
    """Refuse a dtype the device cannot train in, with the reason (`bf16_supported`: the CUDA device's
    bf16 support; asked of torch when None)."""
    if setting not in (*_STORED, "auto"):
        raise ValueError(f"model.dtype must be one of auto, float32, bfloat16, float16; got {setting!r}")
    if setting == "bfloat16" and device.type == "cuda":
        ok = torch.cuda.is_bf16_supported() if bf16_supported is None else bf16_supported
        if not ok:
            raise ValueError("model.dtype bfloat16: this CUDA device has no bf16 support (before Ampere); "
                             "use float16 (mixed precision with loss scaling) or float32")


def stored_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The dtype the parameters are stored in (see the module docstring)."""
    check_dtype(setting, device)
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _STORED[setting]


def autocast(setting: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward's precision context: fp16 autocast for `float16`, nothing otherwise."""
    if setting == "float16":
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def grad_scaler(setting: str, device: torch.device) -> torch.amp.GradScaler | None:
    """A dynamic loss scaler for `float16` (fp16 gradients underflow without one), else None."""
    if setting != "float16":
        return None
    return torch.amp.GradScaler(device.type, init_scale=2.0 ** 12)
