"""Batch building: `TrajectoryGroup`s → one padded, typed `Batch` of tensors the trainer consumes.

Layout: each row is `prompt_ids + response_ids` right-padded to the longest row (capped at
`max_seq_len`, cutting the end). Token-level tensors have shape [B, L-1] and are aligned with the
*next-token* targets `input_ids[:, 1:]`: column j holds what concerns token j+1 (its log-prob, its
loss-mask bit, its behaviour log-prob). The loss-mask invariant (1 exactly on policy-sampled tokens) is
carried from `Trajectory.loss_mask` unchanged.

Not here: advantages (see `advantages.py`) and anything touching a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from searchr1.core.schemas import TrajectoryGroup
from searchr1.core.segments import oldest_version


@dataclass(frozen=True)
class Batch:
    """One training batch; token tensors are [B, L-1], aligned with `input_ids[:, 1:]`."""

    input_ids: Tensor
    """[B, L] prompt + response ids, right-padded."""
    attention_mask: Tensor
    """[B, L] 1 on real tokens."""
    loss_mask: Tensor
    """[B, L-1] 1 where the target token was sampled by the policy (the only tokens with loss)."""
    response_mask: Tensor
    """[B, L-1] 1 on every response target (sampled + environment tokens; GAE runs over these)."""
    behavior_logprobs: Tensor
    """[B, L-1] log-prob of each target under the behaviour policy (0 off the loss mask)."""
    scores: Tensor
    """[B] scalar reward of each trajectory."""
    token_rewards: Tensor
    """[B, L-1] the reward placed on the last response target (veRL's outcome reward layout)."""
    group_index: Tensor
    """[B] index of the trajectory's group within the step (GRPO grouping)."""
    policy_version: Tensor
    """[B] oldest weight version that generated the row (its oldest segment, `core/segments.py`)."""
    advantages: Tensor | None = None
    """[B] or [B, L-1] advantages, filled by `advantages.py`."""
    returns: Tensor | None = None
    """[B, L-1] value targets (PPO)."""

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum().item())

    def select(self, rows: Sequence[int] | Tensor) -> Batch:
        """The given rows, with columns trimmed to the longest selected row."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        length = int(self.attention_mask[idx].sum(dim=1).max().item()) if len(idx) else 1
        length = max(length, 2)
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                out[f.name] = None
                continue
            value = value[idx]
            if value.dim() == 2:
                width = length if f.name in ("input_ids", "attention_mask") else length - 1
                value = value[:, :width]
            out[f.name] = value
        return Batch(**out)

    def with_(self, **changes) -> Batch:
        return replace(self, **changes)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device))
                        for f in fields(self)})


def build_batch(groups: Sequence[TrajectoryGroup], *, pad_id: int = 0, max_seq_len: int | None = None) -> Batch:
    """Pad every trajectory of `groups` into one `Batch` (rows in group order), each cut to `max_seq_len`
    tokens (the learner's `batch.max_seq_len`; None: none is cut)."""
    rows = [(gi, oldest_version(t, g.policy_version), t) for gi, g in enumerate(groups) for t in g.trajectories]
    if not rows:
        raise ValueError("cannot build a batch from zero trajectories")
    lengths = [len(t.prompt_ids) + len(t.response_ids) for _, _, t in rows]
    if max_seq_len is not None:
        lengths = [min(n, max_seq_len) for n in lengths]
    L = max(max(lengths), 2)
    B = len(rows)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    loss_mask = torch.zeros((B, L - 1), dtype=torch.float32)
    response_mask = torch.zeros((B, L - 1), dtype=torch.float32)
    behavior = torch.zeros((B, L - 1), dtype=torch.float32)
    token_rewards = torch.zeros((B, L - 1), dtype=torch.float32)
    for i, (_, _, t) in enumerate(rows):
        ids = (list(t.prompt_ids) + list(t.response_ids))[: lengths[i]]
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids, dtype=torch.long)
        attention[i, :n] = 1
        p = len(t.prompt_ids)
        kept = max(0, n - p)  # response tokens that survived truncation
        if kept == 0:
            continue
        cols = slice(p - 1, p - 1 + kept)
        loss_mask[i, cols] = torch.tensor(t.loss_mask[:kept], dtype=torch.float32)
        response_mask[i, cols] = 1.0
        behavior[i, cols] = torch.tensor(t.behavior_logprobs[:kept], dtype=torch.float32) * loss_mask[i, cols]
        token_rewards[i, p - 2 + kept] = t.reward
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        response_mask=response_mask,
        behavior_logprobs=behavior,
        scores=torch.tensor([t.reward for _, _, t in rows], dtype=torch.float32),
        token_rewards=token_rewards,
        group_index=torch.tensor([gi for gi, _, _ in rows], dtype=torch.long),
        policy_version=torch.tensor([v for _, v, _ in rows], dtype=torch.long),
    )


def micro_batches(batch: Batch, size: int) -> list[Batch]:
    """Consecutive slices of at most `size` rows (each trimmed to its own longest row)."""
    return [batch.select(range(s, min(s + size, batch.size))) for s in range(0, batch.size, size)]


def shard_rows(batch_size: int, rank: int, world: int) -> list[int]:
    """Rows owned by `rank` among `world` data-parallel ranks (contiguous, as even as possible)."""
    per, extra = divmod(batch_size, world)
    start = rank * per + min(rank, extra)
    return list(range(start, start + per + (1 if rank < extra else 0)))
