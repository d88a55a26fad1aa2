"""Models of the learner: loading the policy / frozen reference / critic from a local HF path, LoRA,
gradient checkpointing, FSDP2 sharding for data parallelism, per-token log-probs (and the top-k or full
logits a vocabulary-wide KL needs), and the full (merged, gathered) state dict the weight publisher writes.

Search-R1 (veRL) uses FSDP1 with param/grad/optimizer offload and a separate critic built as
`AutoModelForTokenClassification(num_labels=1)` from the policy's path; we keep the critic design and
use FSDP2 (`fully_shard`, one unit per decoder layer), which also runs on CPU with gloo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.precision import Precision, precision


@dataclass(frozen=True)
class DistInfo:
    """This process's place among data-parallel ranks."""

    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def dist_info() -> DistInfo:
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size())
    return DistInfo()


def resolve_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def ensure_process_group(device: torch.device) -> None:
    """A process group for FSDP2 to shard over: torchrun's when the process was launched as one of several
    ranks (`distributed.init_distributed` joined it), else a group of one over an in-process store — a
    mixed-precision policy needs a mesh even on one rank."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` is under FSDP2 (its state dicts are then gathered and scattered collectively)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard_model(model: nn.Module, device: torch.device, prec: Precision) -> nn.Module:
    """FSDP2 over every rank (one unit per decoder layer, and the root), with `prec`'s mixed-precision
    policy: fp32 shards, compute-dtype copies for the forward and backward, fp32 gradient reduction."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ensure_process_group(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = prec.mp_policy() or MixedPrecisionPolicy()
    inner = getattr(model, "model", None) or getattr(model, "base_model", None)
    for layer in getattr(inner, "layers", []) or []:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _sharded(info: DistInfo, prec: Precision) -> bool:
    """A trained model is sharded on several ranks, and on one rank when it computes in reduced precision
    (FSDP2's mixed-precision policy keeps its fp32 masters)."""
    return info.enabled or prec.mixed


def load_policy(settings: LearnerSettings, device: torch.device, info: DistInfo) -> nn.Module:
    """The trainable policy: fp32 master weights, LoRA-wrapped if configured (then a frozen base in the
    compute dtype and fp32 adapters, unsharded), else sharded when world > 1 or the compute is reduced
    (`precision.py`)."""
    from transformers import AutoModelForCausalLM

    prec = precision(settings.model.dtype, device)
    lora_on = settings.model.lora.enabled
    if lora_on and info.enabled:
        raise ValueError("LoRA with more than one rank is not supported yet; use full fine-tuning")
    dtype = prec.frozen if lora_on else prec.master
    model = AutoModelForCausalLM.from_pretrained(settings.model.path, dtype=dtype).to(device)
    model.config.use_cache = False
    if settings.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_on:
        from peft import LoraConfig, get_peft_model

        lora = settings.model.lora
        return get_peft_model(model, LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), task_type="CAUSAL_LM")).train()
    model.train()
    if _sharded(info, prec):
        model = shard_model(model, device, prec)
    return model


def load_reference(settings: LearnerSettings, device: torch.device, info: DistInfo | None = None) -> nn.Module:
    """Frozen copy of the initial policy, for the KL term, stored in the compute dtype: every rank keeps a
    full copy and its forward runs the arithmetic of the policy's mixed-precision forward. With an EMA
    anchor (`ref_ema_tau < 1`) the reference is state that moves a little each step: fp32, sharded exactly
    like the policy (same mesh, same mixed-precision policy) so that `reference.ema_update_` averages local
    fp32 shards."""
    from transformers import AutoModelForCausalLM

    info = dist_info() if info is None else info
    prec = precision(settings.model.dtype, device)
    ema = settings.algorithm.ref_ema_tau < 1.0
    ref = AutoModelForCausalLM.from_pretrained(
        settings.model.path, dtype=prec.master if ema else prec.frozen).to(device)
    ref.config.use_cache = False
    ref.eval().requires_grad_(False)
    if ema and _sharded(info, prec):
        ref = shard_model(ref, device, prec)
    return ref


def load_critic(settings: LearnerSettings, device: torch.device, info: DistInfo) -> nn.Module:
    """Critic = the policy's backbone with a scalar token head (veRL: TokenClassification, 1 label); fp32
    masters, sharded like the policy."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    prec = precision(settings.model.dtype, device)
    path = settings.model.critic_path or settings.model.path
    # classifier_dropout 0 as veRL sets it: dropout on the value head would make values (and the
    # "old values" of the clipped value loss) random
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    critic = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=prec.master).to(device)
    if settings.model.gradient_checkpointing:
        critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    critic.train()
    if _sharded(info, prec):
        critic = shard_model(critic, device, prec)
    return critic


def forward_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, entropy: bool = False,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each next token ([B, L-1], float32) and optionally the per-position entropy.

    With `mask` ([B, L-1], e.g. the response mask) only those positions are computed (0 elsewhere): the
    LM head runs from the first masked column on (`logits_to_keep`), and the vocabulary-wide softmax,
    log-sum-exp and entropy run on masked positions only — prompts never pay for them."""
    L = input_ids.shape[1]
    start = 0
    kwargs = {}
    if mask is not None:
        cols = mask.bool().any(dim=0).nonzero()
        start = int(cols[0]) if len(cols) else L - 2
        kwargs["logits_to_keep"] = L - start
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs).logits
    logits = logits[:, -(L - start):-1] if start else logits[:, :-1]
    targets = input_ids[:, start + 1:]
    if mask is None:
        logits = logits.float()
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        ent = None
        if entropy:  # logsumexp(z) − Σ softmax(z)·z, as on the masked path below
            ent = torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
        return logp, ent
    sel = mask[:, start:].bool()
    flat = logits[sel].float()  # [N, V] on the selected positions only
    lse = torch.logsumexp(flat, dim=-1)
    logp_flat = flat.gather(-1, targets[sel].unsqueeze(-1)).squeeze(-1) - lse
    zeros = torch.zeros(input_ids.shape[0], L - 1, dtype=torch.float32, device=input_ids.device)
    full_sel = torch.nn.functional.pad(sel, (start, 0))
    logp = zeros.masked_scatter(full_sel, logp_flat)
    ent = None
    if entropy:
        ent_flat = lse - (torch.softmax(flat, dim=-1) * flat).sum(dim=-1)
        ent = zeros.masked_scatter(full_sel, ent_flat)
    return logp, ent


@dataclass(frozen=True)
class KLLogits:
    """What the KL term needs from one forward over the positions of `mask` ([B, L-1] → N selected)."""

    log_prob: Tensor
    """[B, L-1] log-prob of each next token (0 off the mask), float32 (float64 for a float64 model)."""
    entropy: Tensor | None
    """[B, L-1] per-position entropy when asked for, else None."""
    logits: Tensor
    """[N, k] logits gathered at `ids` (or at the model's own top k), or [N, V] the full logits."""
    logsumexp: Tensor
    """[N] log-sum-exp over the whole vocabulary."""
    ids: Tensor | None
    """[N, k] the token ids of `logits` (None for full logits)."""
    selected: Tensor
    """[B, L-1] bool, the N positions (row-major order) the flat tensors describe."""


def forward_kl_logits(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, mask: Tensor, *, entropy: bool = False,
    topk: int = 0, at_ids: Tensor | None = None,
) -> KLLogits:
    """One forward giving `forward_logprobs`'s log-probs (and entropy) plus, on the positions of `mask`,
    logits for a KL over the vocabulary: gathered at `at_ids` ([N, k], another model's top k), or at
    this model's own top `topk` (ids returned), or — neither given — the full [N, V] logits. The
    vocabulary-wide tensors live only inside this call unless the full logits are asked for, so a top-k
    KL keeps O(N·k) per micro-batch. Gradients flow through everything but `ids`."""
    if topk and at_ids is not None:
        raise ValueError("give either topk (this model's own top k) or at_ids (gather at given ids), not both")
    L = input_ids.shape[1]
    cols = mask.bool().any(dim=0).nonzero()
    start = int(cols[0]) if len(cols) else L - 2
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                   logits_to_keep=L - start).logits
    logits = logits[:, -(L - start):-1] if start else logits[:, :-1]
    sel = mask[:, start:].bool()
    flat = logits[sel]  # [N, V], at least float32
    flat = flat.to(torch.promote_types(flat.dtype, torch.float32))
    lse = torch.logsumexp(flat, dim=-1)
    targets = input_ids[:, start + 1:][sel]
    logp_flat = flat.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    full_sel = torch.nn.functional.pad(sel, (start, 0))
    zeros = torch.zeros(input_ids.shape[0], L - 1, dtype=flat.dtype, device=input_ids.device)
    logp = zeros.masked_scatter(full_sel, logp_flat)
    ent = None
    if entropy:
        ent = zeros.masked_scatter(full_sel, lse - (torch.softmax(flat, dim=-1) * flat).sum(dim=-1))
    ids = None
    if at_ids is not None:
        if at_ids.shape[0] != flat.shape[0]:
            raise ValueError(f"at_ids covers {at_ids.shape[0]} positions, the mask selects {flat.shape[0]}")
        ids = at_ids.to(device=flat.device, dtype=torch.long)
        out = flat.gather(-1, ids)
    elif topk:
        with torch.no_grad():
            ids = flat.detach().topk(min(topk, flat.shape[-1]), dim=-1).indices
        out = flat.gather(-1, ids)
    else:
        out = flat
    return KLLogits(logp, ent, out, lse, ids, full_sel)


def forward_values(critic: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The critic's value of the state before each next token ([B, L-1], float32)."""
    out = critic(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return out[:, :-1, 0].float()


def full_state_dict(model: nn.Module, info: DistInfo) -> dict[str, Tensor]:
    """Every parameter and buffer as full CPU tensors (gathered on rank 0 under FSDP; other ranks get
    an empty dict). A collective under FSDP: call it on every rank."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}  # never the live tensors


def load_full_state_dict(model: nn.Module, state: dict[str, Tensor], info: DistInfo) -> None:
    """Inverse of `full_state_dict` (rank 0's tensors are broadcast under FSDP)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True))
        return
    model.load_state_dict(state)


def export_weights(model: nn.Module, info: DistInfo,
                   dtype: torch.dtype | None = None) -> tuple[Any, dict[str, Tensor]]:
    """(HF model to call `save_pretrained` on, its full state dict with LoRA merged, floating tensors cast
    to `dtype` — the published dtype — when given). Collective."""
    if hasattr(model, "merge_adapter") and hasattr(model, "get_base_model"):  # peft
        model.merge_adapter()
        try:
            base = model.get_base_model()
            state = {}
            for k, v in base.state_dict().items():
                if "lora_" in k:
                    continue
                state[k.replace(".base_layer.", ".")] = v.detach().cpu().clone()
        finally:
            model.unmerge_adapter()
        return base, cast_floating(_untie(base, state), dtype)
    return model, cast_floating(_untie(model, full_state_dict(model, info)), dtype)


def cast_floating(state: dict[str, Tensor], dtype: torch.dtype | None) -> dict[str, Tensor]:
    """`state`'s floating-point tensors cast to `dtype` (round to nearest even), in place one tensor at a
    time so that the wider copy of each is freed as the next is cast; `dtype` None: unchanged."""
    if dtype is None:
        return state
    for k in list(state):
        v = state[k]
        if v.is_floating_point() and v.dtype != dtype:
            state[k] = v.to(dtype)
    return state


def _untie(model: nn.Module, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drop the output embedding when it is tied to the input one (as `save_pretrained` does unsharded;
    FSDP's gathered state dict lists it twice)."""
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in state:
        state.pop("lm_head.weight", None)
    return state
