"""The learner's step at model shapes a GPU user trains, in the recipe's precision (bf16 compute over fp32
master weights and AdamW state: FSDP2's mixed-precision policy, one unit per decoder layer, on one device),
gradient checkpointing, and the KL term to a frozen reference as the learner
computes it (`forward_kl_logits` + `topk_kl`), on a randomly initialised Qwen2 built from its config
alone (no weights are downloaded).

    python benchmarks/learner.py --device cuda                        # Qwen2.5-3B and 0.5B shapes
    python benchmarks/learner.py --device cpu --fsdp --shapes tiny    # the same code path, tiny, on CPU

One step: policy forward over a batch of `--fsdp-batch` sequences of `--fsdp-len` tokens (the last
`--fsdp-response` of them are the response), the reference's forward (no grad), the policy-gradient term
plus the KL term, backward, AdamW. Prints for each shape and each KL variant (top-k at `--kl-topk`, full
vocabulary): tokens/s (median of `--fsdp-repeats` steps after one warm-up), model FLOPs utilisation
against `--peak-tflops` (the device's dense bf16 peak; 989 is an H100 SXM's), peak device memory of the
step, and the memory of the KL term alone (reference forward + KL, measured on its own). On CUDA memory
is the allocator's peak above its level before; on CPU it is the growth of the process's peak resident set
(VmHWM), which reads 0 when the allocator reuses memory it already holds.

Model FLOPs per token (PaLM's convention, recomputation not counted): 6·N for the policy's forward and
backward plus 2·N for the reference's forward, N = non-embedding parameters + the LM head
(hidden × vocabulary), plus attention 12·layers·hidden·L (policy) and 4·layers·hidden·L (reference).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

SHAPES = {
    # Qwen2.5-3B / 0.5B config.json (tied embeddings, 151,936-token vocabulary).
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
}
VOCAB = 151_936


@dataclass(frozen=True)
class StepFigures:
    tokens_per_s: float
    mfu: float
    peak_mib: float
    kl_mib: float
    resident_mib: float = float("nan")
    """Device memory held between steps (weights, gradients, optimizer state, reference; CUDA only)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: this benchmark (FSDP, bf16) instead of the CPU learner comparison")
    p.add_argument("--fsdp", action="store_true", help="run this benchmark on --device cpu too")
    p.add_argument("--shapes", default="qwen2.5-3b,qwen2.5-0.5b", help=f"comma-separated, of {sorted(SHAPES)}")
    p.add_argument("--fsdp-batch", type=int, default=8, help="sequences per step")
    p.add_argument("--fsdp-len", type=int, default=2048, help="tokens per sequence")
    p.add_argument("--fsdp-response", type=int, default=1536, help="response tokens per sequence")
    p.add_argument("--fsdp-repeats", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak, TFLOP/s")
    p.add_argument("--no-checkpointing", action="store_true", help="turn gradient checkpointing off")


def model_flops_per_token(cfg: dict, vocab: int, seq_len: int) -> float:
    """Model FLOPs per trained token of one step (see the module docstring)."""
    h, layers, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    kv = h * cfg["num_key_value_heads"] // cfg["num_attention_heads"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * inter  # q, o; k, v; gate, up, down (biases left out)
    n = layers * per_layer + h * vocab
    return 8 * n + 16 * layers * h * seq_len


def _setup(device_type: str):
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def _build(cfg: dict, vocab: int, device, checkpointing: bool, shard: bool):
    """The policy as the learner keeps it in `model.dtype = "bfloat16"` (fp32 master weights, FSDP2 with the
    bf16 mixed-precision policy: `searchr1.learner.train.model.shard_model`), or (`shard` False) the frozen
    reference as the learner stores it: bf16, no grad."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from searchr1.learner.train.model import shard_model
    from searchr1.learner.train.precision import precision

    config = Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=32768,
                         rope_theta=1e6, attn_implementation="sdpa", use_cache=False, **cfg)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.float32 if shard else torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if shard:
        model = shard_model(model, device, precision("bfloat16", device))
        model.train()
    else:
        model.eval().requires_grad_(False)
    return model


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _Memory:
    """Peak memory of a block: the device's allocator on CUDA, the process's VmHWM on CPU."""

    def __init__(self, device) -> None:
        self.device = device

    def __enter__(self) -> _Memory:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            import gc

            gc.collect()
            try:
                Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            except OSError:
                pass
            self.start = _rss_mib("VmRSS") * 2**20
        return self

    def __exit__(self, *exc) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.start
        else:
            self.peak = max(0.0, _rss_mib("VmHWM") * 2**20 - self.start)
        self.mib = self.peak / 2**20


def _kl_term(policy, reference, ids, mask, topk: int):
    """The learner's KL term: reference logits at the policy's top k (or the full vocabulary)."""
    import torch

    from searchr1.learner.algo.kl_estimators import topk_kl
    from searchr1.learner.train.model import forward_kl_logits

    attn = torch.ones_like(ids)
    pol = forward_kl_logits(policy, ids, attn, mask, topk=topk)
    with torch.no_grad():
        ref = forward_kl_logits(reference, ids, attn, mask, at_ids=pol.ids)
    sel = pol.selected
    head, tail = topk_kl(pol.logits, pol.logsumexp, ref.logits, ref.logsumexp, topk_ids=pol.ids,
                         sampled_ids=ids[:, 1:][sel] if pol.ids is not None else None,
                         log_prob=pol.log_prob[sel] if pol.ids is not None else None,
                         ref_log_prob=ref.log_prob[sel] if pol.ids is not None else None)
    return pol.log_prob, (head + tail).mean()


def run_shape(name: str, args, topk: int) -> StepFigures:
    import torch

    device = torch.device(args.device)
    cfg = SHAPES[name]
    policy = _build(cfg, VOCAB, device, not args.no_checkpointing, shard=True)
    reference = _build(cfg, VOCAB, device, False, shard=False)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)  # as the learner builds it (foreach on CUDA)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (args.fsdp_batch, args.fsdp_len), generator=g).to(device)
    mask = torch.zeros(args.fsdp_batch, args.fsdp_len - 1, dtype=torch.bool, device=device)
    mask[:, args.fsdp_len - 1 - args.fsdp_response:] = True
    adv = torch.randn(args.fsdp_batch, 1, generator=g).to(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        logp, kl = _kl_term(policy, reference, ids, mask, topk)
        loss = -(logp * adv * mask).sum() / mask.sum() + 0.001 * kl
        loss.backward()
        opt.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()
    resident = torch.cuda.memory_allocated() / 2**20 if device.type == "cuda" else float("nan")
    times, peaks = [], []
    for _ in range(args.fsdp_repeats):
        with _Memory(device) as mem:
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        peaks.append(mem.mib)
    with _Memory(device) as kl_mem:  # the KL term alone: both forwards' vocabulary-wide tensors + KL
        with torch.no_grad():
            _kl_term(policy, reference, ids, mask, topk)
    tokens = args.fsdp_batch * args.fsdp_len
    tps = tokens / statistics.median(times)
    mfu = tps * model_flops_per_token(cfg, VOCAB, args.fsdp_len) / (args.peak_tflops * 1e12)
    return StepFigures(tps, mfu, max(peaks), kl_mem.mib, resident)


def main(args) -> None:
    import torch

    _setup(args.device)
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; known: {sorted(SHAPES)}")
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"learner step, bf16 compute over fp32 masters, FSDP2 on one {args.device} device ({where}); gradient checkpointing "
          f"{'off' if args.no_checkpointing else 'on'}; batch {args.fsdp_batch} x {args.fsdp_len} tokens "
          f"({args.fsdp_response} response); vocabulary {VOCAB:,}; MFU against {args.peak_tflops:g} TFLOP/s")
    print(f"{'shape':<14} {'KL':<12} {'tokens/s':>10} {'MFU':>7} {'peak MiB':>10} {'KL term MiB':>12} "
          f"{'resident MiB':>13}")
    for name in names:
        for label, k in ((f"top-{args.kl_topk}", args.kl_topk), ("full vocab", 0)):
            try:
                f = run_shape(name, args, k)
            except torch.OutOfMemoryError as e:
                print(f"{name:<14} {label:<12} out of device memory ({str(e).splitlines()[0][:120]})")
                continue
            finally:
                if args.device == "cuda":
                    torch.cuda.empty_cache()  # the last shape's models are gone with run_shape's frame
            print(f"{name:<14} {label:<12} {f.tokens_per_s:>10.1f} {f.mfu:>7.1%} {f.peak_mib:>10.0f} "
                  f"{f.kl_mib:>12.0f} {f.resident_mib:>13.0f}")
