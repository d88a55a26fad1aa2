"""Learner step throughput vs a bare forward+backward of the same padded batch on the same model.

    .venv/bin/python benchmarks/learner.py [--threads 1] [--hidden 256] [--layers 4] [--vocab 4096]
                                           [--groups 4] [--group-size 4] [--response 192] [--repeats 5]
                                           [--micro 8]

Baseline (measured in the same run, interleaved with the learner steps so machine load hits both):
forward of the padded batch, token-mean NLL of the policy tokens, backward (no optimizer step); a second
baseline computes logits only from the first response column, as the learner does, so the difference to
it is the learner's own bookkeeping (advantages, clip loss, normalisation, grad clip, AdamW step).
Learner variants: `Trainer.train_step` (advantages, log-probs, PPO clip loss, normalisation, grad clip,
AdamW step) with (a) no entropy and no KL, (b) Search-R1's entropy bonus 0.001, (c) plus the KL loss to a
frozen reference (an extra no-grad forward). The whole batch is one micro-batch in every case, so all see
the same padded tensor. Prints median wall-time and CPU-time tokens/s (prompt + response tokens) and the overheads.
Then micro-batching: forward+backward in micro-batches of `--micro` over a batch with rollout-like spread
lengths, in dataset order (baseline) vs length-sorted (what `Trainer` does): padded tokens and time ratio.
Then the KL term on a Qwen2 with Qwen2.5's 151,936-token vocabulary (`--kl-vocab`; small otherwise:
`--kl-hidden`, `--kl-layers`) for one sequence of each of `--kl-lengths` tokens: a policy forward+backward
without KL (baseline), with the full-vocabulary reverse KL to a reference (both models' [N, V] logits), and
with the top-k reverse KL (`--kl-topk`, EMA-PG's 32: the reference's logits gathered at the policy's top k,
tail correction on). Peak memory is the process's peak resident set above its level before the step
(Linux VmHWM, reset per measurement). `--kl-only` runs just this part; `--no-kl` skips it.

`--device cuda` (or `--fsdp` on CPU) runs benchmarks/learner_gpu.py instead: the learner's step in bf16
under FSDP2 with gradient checkpointing at the Qwen2.5-3B and 0.5B shapes (`--shapes`), tokens/s, model
FLOPs utilisation against `--peak-tflops`, peak memory, and the KL term's memory top-k vs full vocabulary.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.support` when run as a script
sys.path.insert(0, str(Path(__file__).resolve().parent))
import learner_gpu  # noqa: E402  (the --device cuda / --fsdp path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--response", type=int, default=192)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--micro", type=int, default=8, help="micro-batch size of the micro-batching comparison")
    p.add_argument("--kl-vocab", type=int, default=151_936)
    p.add_argument("--kl-hidden", type=int, default=64)
    p.add_argument("--kl-layers", type=int, default=2)
    p.add_argument("--kl-lengths", default="1024,2048", help="comma-separated sequence lengths (tokens)")
    p.add_argument("--kl-prompt", type=int, default=128)
    p.add_argument("--kl-topk", type=int, default=32)
    p.add_argument("--kl-repeats", type=int, default=1)
    p.add_argument("--kl-only", action="store_true")
    p.add_argument("--no-kl", action="store_true")
    learner_gpu.add_arguments(p)
    args = p.parse_args()
    if args.device == "cuda" or args.fsdp:
        learner_gpu.main(args)
        return
    if args.kl_only:
        import torch

        torch.set_num_threads(args.threads)
        kl_term(args)
        return

    import torch

    torch.set_num_threads(args.threads)
    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.settings import LearnerSettings
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.model import DistInfo, forward_logprobs
    from tests.support.synthetic import synthetic_group, tiny_qwen2

    tmp = Path(tempfile.mkdtemp(prefix="bench-learner-"))
    model_path = tiny_qwen2(tmp / "model", vocab=args.vocab, hidden=args.hidden, layers=args.layers)
    rng = random.Random(0)
    groups = [synthetic_group(f"g{i}", group_size=args.group_size, vocab=args.vocab, prompt_len=args.prompt,
                              response_len=args.response, rng=rng) for i in range(args.groups)]
    batch = build_batch(groups)
    n_rows = batch.size
    tokens = batch.num_tokens
    padded = batch.input_ids.numel()

    def settings(entropy: float, kl: bool) -> LearnerSettings:
        return LearnerSettings(
            model={"path": str(model_path)}, device="cpu",
            algorithm={"advantage": "grpo", "entropy_coef": entropy, "use_kl_loss": kl, "kl_loss_coef": 0.001},
            optim={"lr": 1e-6}, batch={"micro_batch_size": n_rows, "groups_per_step": args.groups},
        )

    variants = {
        "learner (pg only)": build_training(settings(0.0, False), DistInfo()),
        "learner (+entropy)": build_training(settings(0.001, False), DistInfo()),
        "learner (+entropy +KL ref)": build_training(settings(0.001, True), DistInfo()),
    }
    base_model = build_training(settings(0.0, False), DistInfo()).trainer.policy

    def bare() -> None:
        base_model.zero_grad(set_to_none=True)
        logp, _ = forward_logprobs(base_model, batch.input_ids, batch.attention_mask)
        loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
        loss.backward()

    def bare_trimmed() -> None:
        base_model.zero_grad(set_to_none=True)
        logp, _ = forward_logprobs(base_model, batch.input_ids, batch.attention_mask, mask=batch.response_mask)
        loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
        loss.backward()

    times: dict[str, list[float]] = {"bare forward+backward": [], "bare, response-only logits": [],
                                     **{k: [] for k in variants}}
    runs = {"bare forward+backward": bare, "bare, response-only logits": bare_trimmed,
            **{k: (lambda t=t: t.trainer.train_step(batch, version=0)) for k, t in variants.items()}}
    for fn in runs.values():  # warm-up
        fn()
    cpu: dict[str, list[float]] = {k: [] for k in times}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)

    base = statistics.median(times["bare forward+backward"])
    print(f"model: Qwen2 hidden={args.hidden} layers={args.layers} vocab={args.vocab}; torch threads={args.threads}")
    print(f"batch: {n_rows} trajectories, {tokens} real tokens ({padded} padded), "
          f"{batch.num_loss_tokens} loss tokens; {args.repeats} interleaved repeats, median")
    cbase = statistics.median(cpu["bare forward+backward"])
    print(f"{'variant':30s} {'wall s':>7s} {'tokens/s':>9s} {'overhead':>9s} | {'CPU s':>7s} {'tokens/CPU-s':>12s} "
          f"{'overhead':>9s}")
    for name, wall in times.items():
        med, cmed = statistics.median(wall), statistics.median(cpu[name])
        print(f"{name:30s} {med:7.3f} {tokens / med:9.0f} {100 * (med / base - 1):8.1f}% | {cmed:7.3f} "
              f"{tokens / cmed:12.0f} {100 * (cmed / cbase - 1):8.1f}%")
    print("(medians; with one torch thread, process CPU time is far less sensitive to other jobs on a shared "
          "machine than wall time)")
    micro_batching(args, base_model)
    if not args.no_kl:
        kl_term(args)


def micro_batching(args, model) -> None:
    """Length-sorted vs dataset-order micro-batches on a batch whose lengths spread like rollouts' (an
    answer after one turn next to four search turns): the same forward+backward, micro-batches of
    `--micro`; baseline = dataset order (what the learner did before it sorted)."""
    import random as _random

    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.train.model import forward_logprobs
    from tests.support.synthetic import synthetic_group

    rng = _random.Random(1)
    groups = []
    for i in range(args.groups):
        g = synthetic_group(f"m{i}", group_size=args.group_size, vocab=args.vocab, prompt_len=args.prompt,
                            response_len=2 * args.response, rng=rng)
        for t in g.trajectories:  # 1/4 to 2x the nominal response length
            n = rng.randint(args.response // 4, 2 * args.response)
            t.response_ids, t.loss_mask, t.behavior_logprobs = (t.response_ids[:n], t.loss_mask[:n],
                                                                t.behavior_logprobs[:n])
        groups.append(g)
    batch = build_batch(groups)
    lengths = batch.attention_mask.sum(1).tolist()
    order = list(range(batch.size))
    by_length = sorted(order, key=lambda r: -lengths[r])

    def chunks(rows):
        return [rows[i:i + args.micro] for i in range(0, len(rows), args.micro)]

    def run(rows) -> None:
        model.zero_grad(set_to_none=True)
        for part in chunks(rows):
            mb = batch.select(part)
            logp, _ = forward_logprobs(model, mb.input_ids, mb.attention_mask, mask=mb.response_mask)
            (-(logp * mb.loss_mask).sum() / batch.loss_mask.sum()).backward()

    padded = {name: sum(len(part) * max(lengths[r] for r in part) for part in chunks(rows))
              for name, rows in (("dataset order", order), ("length-sorted", by_length))}
    times = {"dataset order": [], "length-sorted": []}
    run(order)
    for _ in range(args.repeats):
        for name, rows in (("dataset order", order), ("length-sorted", by_length)):
            t0 = time.perf_counter()
            run(rows)
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["dataset order"])
    print(f"\nmicro-batches of {args.micro}, {batch.size} trajectories of {min(lengths)}-{max(lengths)} tokens "
          f"({batch.num_tokens} real):")
    for name, wall in times.items():
        med = statistics.median(wall)
        print(f"{name:30s} {med:7.3f} s  padded tokens {padded[name]:7d} ({padded[name] / batch.num_tokens:.2f}x real)"
              f"  time {med / base:.2f}x dataset order")


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_above_start(fn) -> tuple[float, float]:
    """(seconds, peak resident MiB above the level before `fn`) — VmHWM reset through clear_refs."""
    import gc

    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    before = _rss_mib("VmRSS")
    t0 = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t0
    return elapsed, _rss_mib("VmHWM") - before


def kl_term(args) -> None:
    """Peak memory and time of a policy update step's KL term, full vocabulary vs top-k."""
    import torch

    from searchr1.learner.algo.losses import topk_kl
    from searchr1.learner.train.model import forward_kl_logits, forward_logprobs
    from tests.support.synthetic import tiny_qwen2

    tmp = Path(tempfile.mkdtemp(prefix="bench-kl-"))
    path = tiny_qwen2(tmp / "model", vocab=args.kl_vocab, hidden=args.kl_hidden, layers=args.kl_layers)
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    with torch.no_grad():  # a reference that differs from the policy
        for prm in reference.parameters():
            prm.add_(0.01 * torch.randn_like(prm))
    gen = torch.Generator().manual_seed(0)

    def inputs(length: int):
        ids = torch.randint(2, args.kl_vocab, (1, length), generator=gen)
        attn = torch.ones_like(ids)
        mask = torch.zeros(1, length - 1)
        mask[:, args.kl_prompt - 1:] = 1.0
        return ids, attn, mask

    def no_kl(ids, attn, mask) -> None:
        policy.zero_grad(set_to_none=True)
        logp, _ = forward_logprobs(policy, ids, attn, mask=mask)
        (-(logp * mask).sum() / mask.sum()).backward()

    def full(ids, attn, mask) -> None:
        policy.zero_grad(set_to_none=True)
        with torch.no_grad():
            ref = forward_kl_logits(reference, ids, attn, mask)
        out = forward_kl_logits(policy, ids, attn, mask)
        head, _ = topk_kl(out.logits, out.logsumexp, ref.logits, ref.logsumexp, direction="reverse")
        (-(out.log_prob * mask).sum() / mask.sum() + 0.001 * head.mean()).backward()

    def topk(ids, attn, mask) -> None:
        policy.zero_grad(set_to_none=True)
        out = forward_kl_logits(policy, ids, attn, mask, topk=args.kl_topk)  # π_old = π: one mini-batch
        with torch.no_grad():
            ref = forward_kl_logits(reference, ids, attn, mask, at_ids=out.ids)
        sel = out.selected
        head, tail = topk_kl(out.logits, out.logsumexp, ref.logits, ref.logsumexp, direction="reverse",
                             topk_ids=out.ids, sampled_ids=ids[:, 1:][sel], log_prob=out.log_prob[sel],
                             ref_log_prob=ref.log_prob[sel])
        (-(out.log_prob * mask).sum() / mask.sum() + 0.001 * (head + tail).mean()).backward()

    runs = {"no KL (baseline)": no_kl, "full-vocabulary KL": full, f"top-k KL (k={args.kl_topk})": topk}
    params = sum(p.numel() for p in policy.parameters())
    print(f"\nKL term: Qwen2 vocab={args.kl_vocab} hidden={args.kl_hidden} layers={args.kl_layers} "
          f"({params / 1e6:.1f}M params), one sequence per step, prompt {args.kl_prompt} tokens; "
          f"median of {args.kl_repeats} (time), max (memory); torch threads={torch.get_num_threads()}")
    print(f"{'length':>6s} {'variant':24s} {'step s':>7s} {'peak MiB':>9s}")
    for length in (int(x) for x in args.kl_lengths.split(",")):
        batch = inputs(length)
        for name, fn in runs.items():
            fn(*batch)  # warm-up
            got = [_peak_above_start(lambda f=fn, b=batch: f(*b)) for _ in range(args.kl_repeats)]
            print(f"{length:6d} {name:24s} {statistics.median(t for t, _ in got):7.3f} "
                  f"{max(m for _, m in got):9.0f}")


if __name__ == "__main__":
    main()
