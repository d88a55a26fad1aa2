"""GPU shapes and what each stage costs on them: the per-token rates the simulator uses for a GPU run,
each stated with its source. Pure arithmetic.

Sources (docs/performance.md, "Sizing a GPU run", lists them with the figures):

- GPUs: NVIDIA's H100 and H200 datasheets — H100 SXM 989 TFLOP/s dense BF16, 3.35 TB/s HBM3, 80 GB; H200
  the same compute with 4.8 TB/s HBM3e and 141 GB (https://www.nvidia.com/en-us/data-center/h100/,
  https://www.nvidia.com/en-us/data-center/h200/).
- Models: Qwen2.5-3B's and Qwen2.5-7B's config.json on the Hugging Face Hub (layers, widths, heads,
  vocabulary).
- The learner: measured with this repository's `benchmarks/learner.py --device cuda` (FSDP2 on one GPU,
  gradient checkpointing, the top-32 KL term's reference forward, AdamW) on an H100 80GB HBM3 at the
  Qwen2.5-3B shape, in the recipe's precision (fp32 master weights and AdamW state, bf16 compute): 10,413
  tokens/s on 4 × 2,048-token sequences, 28.5% of the BF16 peak in model FLOPs (8·N per token plus
  attention); 8 × 2,048 did not fit beside its 53 GB of resident state. With bf16 parameters updated in
  place the same GPU reached 34.6% on 8 × 2,048. The 7B shape is modelled at the 3B shape's utilisation.
- Decoding: a memory-bound roofline — one iteration over n sequences reads the weights once and each
  sequence's KV cache, and does 2·N FLOPs per token — at `decode_bw_share` of the datasheet bandwidth and
  `decode_flops_share` of its compute; prefill at `prefill_flops_share` of the compute. These three are
  assumptions (stated where the table is printed); the table's cross-check against NeMo RL's published
  GRPO step times (`NEMO_RL_CHECK`) says how far they land from a measured system.
- Weight sync: the broadcast path's model in docs/performance.md ("Broadcast against snapshot"): the link
  at `link_gb_s` plus xxh3 on each side (0.08 s per GB per core).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from searchr1.simulator.engine import Linear


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_tflops: float
    """Dense BF16 peak."""
    hbm_tb_s: float
    memory_gb: float


H100 = Gpu("H100 SXM 80GB", 989.0, 3.35, 80.0)
H200 = Gpu("H200 141GB", 989.0, 4.8, 141.0)
GPUS = {"h100": H100, "h200": H200}


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def flops_params(self) -> float:
        """N of the 2·N FLOPs per token: the matrices a token passes through (the LM head included)."""
        kv = self.kv_heads * self.head_dim
        per_layer = 2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate
        return self.layers * per_layer + self.hidden * self.vocab

    @property
    def params(self) -> float:
        """Stored parameters (embedding once when tied)."""
        return self.flops_params + (0 if self.tied else self.hidden * self.vocab)

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params  # bf16

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * 2 * self.kv_heads * self.head_dim  # K and V, bf16

    def attention_flops(self, context: float) -> float:
        """Attention FLOPs per token at this context (forward): 4 · layers · hidden · context."""
        return 4.0 * self.layers * self.hidden * context


QWEN25_3B = Shape("Qwen2.5-3B", 36, 2048, 11008, 16, 2, 151_936, True)
QWEN25_7B = Shape("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 152_064, False)
LLAMA31_8B = Shape("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128_256, False)
SHAPES = {s.name.lower(): s for s in (QWEN25_3B, QWEN25_7B, LLAMA31_8B)}


@dataclass(frozen=True)
class Efficiency:
    learner_mfu: float = 0.285
    """Model FLOPs utilisation of a learner step (measured: Qwen2.5-3B shape, one H100, fp32 masters)."""
    fsdp_scaling: float = 0.9
    """Share of per-GPU throughput kept when the learner shards over several GPUs (assumed)."""
    decode_bw_share: float = 0.6
    """Share of the HBM bandwidth a decode iteration reaches (assumed)."""
    decode_flops_share: float = 0.5
    """Share of the BF16 peak for a decode iteration's arithmetic (assumed)."""
    prefill_flops_share: float = 0.5
    """Share of the BF16 peak for prefill (assumed)."""
    link_gb_s: float = 25.0
    """Weight broadcast link, GB/s (NVLink/InfiniBand class; docs/performance.md's model)."""
    hash_s_per_gb: float = 0.08
    """xxh3 of the published bytes, each side (measured on CPU cores: docs/performance.md)."""


def decode_iteration(shape: Shape, gpu: Gpu, eff: Efficiency, context: float) -> Linear:
    """One decode iteration over n sequences of mean `context` tokens: base = the weights read once,
    per sequence = its KV cache read and its arithmetic (each at its share of the datasheet)."""
    bw = gpu.hbm_tb_s * 1e12 * eff.decode_bw_share
    flops = gpu.bf16_tflops * 1e12 * eff.decode_flops_share
    per_seq = context * shape.kv_bytes_per_token / bw + (2 * shape.flops_params + shape.attention_flops(context)) / flops
    return Linear(shape.weight_bytes / bw, per_seq)


def prefill_s_per_token(shape: Shape, gpu: Gpu, eff: Efficiency, context: float) -> float:
    return (2 * shape.flops_params + shape.attention_flops(context)) / (gpu.bf16_tflops * 1e12 * eff.prefill_flops_share)


def learner_flops_per_token(shape: Shape, context: float, old_logprobs: bool) -> float:
    """Policy forward + backward (6·N), the reference's forward (2·N), the old log-probs' forward (2·N)
    when the step needs them (several mini-batches, or stale groups), attention at `context`."""
    dense = (6 + 2 + (2 if old_logprobs else 0)) * shape.flops_params
    return dense + (3 + 1 + (1 if old_logprobs else 0)) * shape.attention_flops(context)


def learner_s_per_token(shape: Shape, gpu: Gpu, eff: Efficiency, gpus: int, context: float,
                        old_logprobs: bool) -> float:
    scaling = 1.0 if gpus == 1 else eff.fsdp_scaling
    return learner_flops_per_token(shape, context, old_logprobs) / (
        gpu.bf16_tflops * 1e12 * eff.learner_mfu * gpus * scaling)


def min_learner_gpus(shape: Shape, gpu: Gpu, bytes_per_param: float = 16.0, headroom: float = 0.7) -> int:
    """GPUs the learner's state needs: bf16 weights and gradients, fp32 master weights and AdamW moments
    (16 bytes per parameter) plus the bf16 reference, within `headroom` of each GPU's memory."""
    need = shape.params * bytes_per_param + shape.weight_bytes
    return max(1, math.ceil(need / (gpu.memory_gb * 1e9 * headroom)))


def weight_sync_s(shape: Shape, eff: Efficiency) -> float:
    """Publishing a version to the workers over the broadcast path: the link plus hashing on each side."""
    gb = shape.weight_bytes / 1e9
    return gb / eff.link_gb_s + 2 * eff.hash_s_per_gb * gb


@dataclass(frozen=True)
class PublishedRun:
    """A published whole-pipeline measurement to compare the modelled rates against."""

    source: str
    shape: Shape
    gpus: int
    generation_batch: int
    mean_sequence: int
    max_sequence: int
    on_policy_step_s: float
    one_step_off_step_s: float


NEMO_RL_CHECK = PublishedRun(
    "NVIDIA NeMo RL, docs/about/performance-summary.md (v0.4): GRPO on OpenMathInstruct-2, DGX-H100, BF16 "
    "training and generation, Megatron-core training backend, Llama-3.1-8B on 16 GPUs: 97.7 s per on-policy "
    "step (1,562 tokens/s/GPU), 74.6 s one step off-policy (2,161)",
    LLAMA31_8B, gpus=16, generation_batch=2048, mean_sequence=1060, max_sequence=4096, on_policy_step_s=97.7,
    one_step_off_step_s=74.6)
