"""The learner's numeric precision (`model.dtype`): what the trained parameters and the optimizer state are
kept in, what the forward and backward compute in, what a frozen reference is stored in, what the
weight publisher writes, and whether the loss is scaled.

| `model.dtype` | master weights + AdamW state | forward / backward | frozen reference | published | loss scaling |
|---|---|---|---|---|---|
| `float32` | fp32 | fp32 | fp32 | fp32 | — |
| `bfloat16` | fp32 | bf16 (FSDP2 `MixedPrecisionPolicy`) | bf16 | bf16 | — |
| `float16` | fp32 | fp16 (FSDP2 `MixedPrecisionPolicy`) | fp16 | fp16 | dynamic (`GradScaler`) |
| `auto` | `bfloat16` on CUDA, `float32` on CPU | | | | |

Reduced precision is reduced *compute*: the parameters AdamW updates are always fp32. An Adam step is
~lr in size; at Search-R1's lr 1e-6 that is far below half a bf16 ulp of a typical weight (~8e-5 at 0.02),
so bf16 parameters updated in place keep ~98% of their values unchanged whatever the gradient. With fp32
masters every weight moves, and the bf16 copy the forward runs on (and the engine loads) changes wherever
the accumulated fp32 movement crosses a bf16 rounding boundary.

The compute copy comes from FSDP2's `MixedPrecisionPolicy(param_dtype=<compute>, reduce_dtype=fp32)`, on
every rank count: one rank is a mesh of one (`ensure_process_group`), so one GPU and eight run the same
numerics, as veRL runs FSDP on one GPU. Each layer's parameters are cast to the compute dtype when they are
gathered for its forward (and again for the backward's recomputation), gradients are computed in that dtype,
reduced in fp32 and land as fp32 gradients on the fp32 master shards. The loss, the log-softmax over the
vocabulary, the advantages and the KL are computed in fp32 (`model.forward_logprobs` upcasts the logits).
The forward thus runs on exactly the weights the engine loads — the published tensors are the masters cast
to the compute dtype with the same round-to-nearest-even — and a frozen reference loaded in the compute
dtype runs the same arithmetic as the policy at step 0. An EMA reference is state that moves by ~(1−τ)·Δθ
per step, so it is kept in fp32 and sharded with the same policy, its average taken on fp32 shards.

LoRA is the exception to sharding (the learner refuses LoRA on several ranks): its frozen base weights are
stored in the compute dtype (they are never updated, so they need no master), and the adapters peft adds are
fp32 (peft's `autocast_adapter_dtype`), so the trained parameters are fp32 there too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SETTINGS = ("auto", "float32", "bfloat16", "float16")
_COMPUTE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_dtype(setting: str, device: torch.device, *, bf16_supported: bool | None = None) -> None:
    """Refuse a dtype the device cannot train in, with the reason (`bf16_supported`: the CUDA device's
    bf16 support; asked of torch when None)."""
    if setting not in SETTINGS:
        raise ValueError(f"model.dtype must be one of {', '.join(SETTINGS)}; got {setting!r}")
    if setting == "bfloat16" and device.type == "cuda":
        ok = torch.cuda.is_bf16_supported() if bf16_supported is None else bf16_supported
        if not ok:
            raise ValueError("model.dtype bfloat16: this CUDA device has no bf16 support (before Ampere); "
                             "use float16 (mixed precision with loss scaling) or float32")


def resolve_setting(setting: str, device: torch.device) -> str:
    """`auto` made concrete: bfloat16 on CUDA, float32 elsewhere; other settings as they are."""
    check_dtype(setting, device)
    if setting == "auto":
        return "bfloat16" if device.type == "cuda" else "float32"
    return setting


@dataclass(frozen=True)
class Precision:
    """What one learner process keeps and computes in (see the module docstring's table)."""

    setting: str
    """The concrete `model.dtype` (never `auto`)."""
    compute: torch.dtype
    """The dtype of the forward and backward passes (and of what is published)."""

    @property
    def master(self) -> torch.dtype:
        """Trained parameters and optimizer state: always fp32."""
        return torch.float32

    @property
    def mixed(self) -> bool:
        """Compute in a narrower dtype than the masters (bf16 or fp16)."""
        return self.compute != torch.float32

    @property
    def frozen(self) -> torch.dtype:
        """A frozen model's storage (a reference without EMA, LoRA's base): the compute dtype."""
        return self.compute

    @property
    def scaled(self) -> bool:
        """Whether the loss is scaled (fp16 gradients underflow without it)."""
        return self.compute == torch.float16

    def mp_policy(self):
        """FSDP2's mixed-precision policy: parameters cast to the compute dtype for the forward and
        backward, gradients reduced in fp32; None in fp32 (FSDP2's default keeps fp32 throughout)."""
        if not self.mixed:
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.compute, reduce_dtype=torch.float32)

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler | None:
        """A dynamic loss scaler for fp16, else None."""
        if not self.scaled:
            return None
        return torch.amp.GradScaler(device.type, init_scale=2.0 ** 12)


def precision(setting: str, device: torch.device) -> Precision:
    """The `Precision` of `model.dtype` on `device`."""
    concrete = resolve_setting(setting, device)
    return Precision(concrete, _COMPUTE[concrete])


def publish_dtype(setting: str, learner: Precision) -> torch.dtype:
    """The dtype of published weights for `weights.dtype`: `auto` = the learner's compute dtype (the
    engine's `engine.dtype` in every shipped config), else the named dtype."""
    if setting == "auto":
        return learner.compute
    if setting not in _COMPUTE:
        raise ValueError(f"weights.dtype must be one of auto, {', '.join(_COMPUTE)}; got {setting!r}")
    return _COMPUTE[setting]
