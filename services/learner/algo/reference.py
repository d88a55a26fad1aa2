"""The EMA anchor of EMA-PG: moving the KL reference towards the policy as an exponential moving
average (loading the reference stays in `train/model.py`, with the other models).

`ema_update_(reference, policy, tau)` sets θ_ref ← τ·θ_ref + (1 − τ)·θ for every parameter and buffer,
in place and without autograd. The trainer calls it right after the optimizer step every
`ref_ema_period` steps, as Search-R1's EMA-PG release does (`ref_policy_ema_tau`,
`ref_policy_ema_update_period`). Under FSDP the reference is sharded exactly like the policy, so the
update runs on the local shards each rank holds, with no communication (the release gathers full
parameters under FSDP1; `model.load_reference` shards the reference when the EMA is on). Not supported,
and refused by the settings: EMA with LoRA (the policy's parameters are base weights plus adapters, the
reference is a plain copy of the base model).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _local(t: Tensor) -> Tensor:
    """The part of `t` this rank holds (a DTensor's local shard; a plain tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _named(module: nn.Module) -> dict[str, Tensor]:
    named = dict(module.named_parameters())
    named.update({f"buffer:{k}": v for k, v in module.named_buffers()})
    return named


@torch.no_grad()
def ema_update_(reference: nn.Module, policy: nn.Module, tau: float) -> None:
    """θ_ref ← τ·θ_ref + (1 − τ)·θ over every parameter and floating-point buffer, in place.

    τ = 1 leaves the reference unchanged; τ = 0 copies the policy. Both modules must have the same
    parameter and buffer names and shapes, and under FSDP the same sharding (each rank updates the
    shards it holds). Integer buffers (e.g. counters) are left as they are."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"EMA tau must be in [0, 1], got {tau}")
    from torch.distributed.fsdp import FSDPModule

    for module in (reference, policy):  # FSDP2 keeps the root's parameters unsharded after a forward
        for m in module.modules():
            if isinstance(m, FSDPModule):
                m.reshard()
    ref, pol = _named(reference), _named(policy)
    if ref.keys() != pol.keys():
        missing, extra = sorted(pol.keys() - ref.keys()), sorted(ref.keys() - pol.keys())
        raise ValueError(f"reference and policy differ in parameters/buffers: missing in reference "
                         f"{missing[:5]}, missing in policy {extra[:5]}")
    pairs = []
    for name, r in ref.items():
        p = pol[name]
        if r.shape != p.shape:
            raise ValueError(f"{name}: reference shape {tuple(r.shape)} != policy shape {tuple(p.shape)}")
        if hasattr(r, "to_local") != hasattr(p, "to_local"):
            raise ValueError(f"{name}: one of reference and policy is sharded and the other is not; "
                             "shard the reference like the policy")
        pairs.append((name, _local(r), _local(p)))
    if tau == 1.0:
        return
    for _, r, p in pairs:
        if not r.is_floating_point():
            continue
        r.mul_(tau).add_(p.to(device=r.device, dtype=r.dtype), alpha=1.0 - tau)


def ema_due(steps_done: int, tau: float, period: int) -> bool:
    """Whether the reference takes an EMA update after the step that brings the count to `steps_done`
    (steps 1-based: every `period`-th step, as EMA-PG's release)."""
    return tau < 1.0 and steps_done > 0 and steps_done % period == 0
