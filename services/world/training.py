"""The warm-start optimisation: copy pre-training on drills, then AdamW on sampled traces with a
warm-up + cosine learning rate, length-grouped micro-batches and a token-mean loss. Torch is imported
inside the functions (the CLI starts without it). Data comes from `sft_data`; checks and the saved
report are the caller's (`warmstart.run_warmstart`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from searchr1.world.settings import WarmstartSettings
from searchr1.world.sft_data import IGNORE, TraceSampler, collate, copy_example, encode_trace


def lr_at(step: int, ws: WarmstartSettings) -> float:
    """Linear warm-up to `lr`, then cosine decay to `lr * min_lr_ratio` at the last step."""
    if ws.warmup_steps and step < ws.warmup_steps:
        return ws.lr * (step + 1) / ws.warmup_steps
    span = max(1, ws.steps - ws.warmup_steps)
    t = min(1.0, (step - ws.warmup_steps) / span)
    return ws.lr * (ws.min_lr_ratio + (1 - ws.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))



@dataclass
class CopyResult:
    steps: int
    losses: list[tuple[int, float]]
    accuracy: float
    seconds: float


def copy_pretrain(model, ws: WarmstartSettings, vocab_size: int, pad_id: int, *,
                  on_log: Callable[[int, float, float], None] | None = None) -> CopyResult:
    """`ws.copy_steps` AdamW steps (constant lr `ws.lr`) on copy drills (`copy_example`): the part of
    pre-training that teaches a small model to copy what it has read. A 0.74M model learns
    the format from traces in a few hundred steps but not to copy a fact out of a passage; on drills it
    shows a sharp transition (copy accuracy ~1% → 99% around step 2,000), after which reading can be
    learned from the traces. `on_log(step, mean loss, accuracy)` every `log_every` steps; the returned
    accuracy is over the last logged window (greedy, labelled tokens)."""
    import torch
    import torch.nn.functional as F

    rng = random.Random(f"copy-{ws.seed}")
    torch.manual_seed(ws.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=ws.weight_decay, betas=(0.9, 0.95))
    losses: list[tuple[int, float]] = []
    window: list[float] = []
    right = total = 0
    acc = 0.0
    t0 = time.perf_counter()
    for step in range(ws.copy_steps):
        input_ids, attention, labels = collate([copy_example(rng, vocab_size) for _ in range(ws.copy_batch_size)],
                                               pad_id)
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        target = labels[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), ws.grad_clip)
        opt.step()
        mask = target != IGNORE
        right += int((logits.argmax(-1)[mask] == target[mask]).sum())
        total += int(mask.sum())
        window.append(float(loss.detach()))
        if (step + 1) % ws.log_every == 0 or step + 1 == ws.copy_steps:
            mean, acc = sum(window) / len(window), right / max(1, total)
            losses.append((step + 1, round(mean, 5)))
            window.clear()
            right = total = 0
            if on_log:
                on_log(step + 1, mean, acc)
    model.eval()
    return CopyResult(ws.copy_steps, losses, round(acc, 4), time.perf_counter() - t0)


@dataclass
class WarmstartResult:
    steps: int
    losses: list[tuple[int, float]]
    seconds: float
    kinds: dict[str, int]


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices of one step's examples grouped into micro-batches of similar length (sorted), each with at
    most `max_tokens` padded tokens (and at least one example). The optimiser still steps once on the
    whole mixed batch; grouping only removes padding work."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and lengths[i] * (len(cur) + 1) > max_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


def step_loss_backward(model, examples: Sequence[tuple[list[int], list[int]]], pad_id: int,
                       max_tokens: int) -> tuple[float, int]:
    """Token-mean cross-entropy over every labelled token of the step, accumulated over length-grouped
    micro-batches (sum per micro-batch / total labelled tokens, so the gradient equals one big padded
    batch's). Calls backward; returns (loss, labelled tokens)."""
    import torch.nn.functional as F

    total = sum(sum(1 for x in lab[1:] if x != IGNORE) for _, lab in examples)
    if total == 0:
        return 0.0, 0
    loss_sum = 0.0
    for group in micro_batches([len(ids) for ids, _ in examples], max_tokens):
        input_ids, attention, labels = collate([examples[i] for i in group], pad_id)
        logits = model(input_ids=input_ids, attention_mask=attention).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                               labels[:, 1:].reshape(-1), ignore_index=IGNORE, reduction="sum")
        (loss / total).backward()
        loss_sum += float(loss.detach())
    return loss_sum / total, total


def train(model, tokenizer, sampler: TraceSampler, ws: WarmstartSettings, *,
          on_log: Callable[[int, float, float], None] | None = None,
          on_step: Callable[[int], None] | None = None) -> WarmstartResult:
    """Run `ws.steps` AdamW steps on sampled traces; returns the logged mean losses. `on_log(step, mean
    loss, lr)` runs every `log_every` steps, `on_step(step)` after every step."""
    import torch

    torch.manual_seed(ws.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=ws.weight_decay, betas=(0.9, 0.95))
    losses: list[tuple[int, float]] = []
    window: list[float] = []
    t0 = time.perf_counter()
    for step in range(ws.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, ws)
        examples = [encode_trace(tokenizer, t) for t in sampler.batch(step, ws.batch_size)]
        opt.zero_grad(set_to_none=True)
        loss, _ = step_loss_backward(model, examples, tokenizer.pad_token_id, ws.micro_batch_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), ws.grad_clip)
        opt.step()
        window.append(loss)
        if on_step:
            on_step(step + 1)
        if (step + 1) % ws.log_every == 0 or step + 1 == ws.steps:
            mean = sum(window) / len(window)
            losses.append((step + 1, round(mean, 5)))
            window.clear()
            if on_log:
                on_log(step + 1, mean, lr_at(step, ws))
    model.eval()
    return WarmstartResult(ws.steps, losses, time.perf_counter() - t0, dict(sorted(sampler.kinds.items())))
