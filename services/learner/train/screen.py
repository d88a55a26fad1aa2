"""The desync screen: before a step trains, the learner's log-probs of every sampled token of the step's
groups, summed per rollout worker against the engine's (`algo/desync.WorkerMismatch`), so the desync
policy can judge each worker on what it is about to contribute.

One no-grad forward over the step's rows (micro-batches of `batch.micro_batch_size`), on the weights
the step starts from — the weights the groups should have been sampled with. It costs about a third of a
step's forward and backward, which is why `desync.enabled` is a choice. Every rank runs the same
forwards over all rows (FSDP gathers parameters per forward: the ranks stay in step), and rank 0's sums
are broadcast so every rank takes the same decision.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from searchr1.core.schemas import TrajectoryGroup
from searchr1.learner.algo.batch import build_batch
from searchr1.learner.algo.desync import WorkerMismatch
from searchr1.learner.train.model import DistInfo, forward_logprobs


@torch.no_grad()
def worker_mismatch(policy: nn.Module, groups: Sequence[TrajectoryGroup], *, pad_id: int, max_seq_len: int,
                    micro_batch_size: int, device: torch.device,
                    info: DistInfo | None = None) -> dict[str, WorkerMismatch]:
    """Per worker id, Σ |log π_learner − log π_engine| and the token count over its groups' sampled tokens."""
    info = info or DistInfo()
    workers = sorted({g.worker_id for g in groups})
    sums = torch.zeros(len(workers), 3, dtype=torch.float64)  # abs_diff, tokens, groups
    index = {w: i for i, w in enumerate(workers)}
    per_chunk = max(1, micro_batch_size // max(len(g.trajectories) for g in groups)) if groups else 1
    for start in range(0, len(groups), per_chunk):
        chunk = list(groups[start:start + per_chunk])
        batch = build_batch(chunk, pad_id=pad_id, max_seq_len=max_seq_len).to(device)
        logp, _ = forward_logprobs(policy, batch.input_ids, batch.attention_mask, mask=batch.loss_mask)
        m = batch.loss_mask.bool()
        diff = torch.where(m, (logp.double() - batch.behavior_logprobs.double()).abs(),
                           torch.zeros((), dtype=torch.float64, device=logp.device))
        row = 0
        for g in chunk:
            n = len(g.trajectories)
            i = index[g.worker_id]
            sums[i, 0] += float(diff[row:row + n].sum())
            sums[i, 1] += float(m[row:row + n].sum())
            sums[i, 2] += 1
            row += n
    if info.enabled:
        t = sums.to(device)
        dist.broadcast(t, src=0)
        sums = t.cpu()
    return {w: WorkerMismatch(tokens=int(sums[i, 1]), abs_diff=float(sums[i, 0]), groups=int(sums[i, 2]))
            for w, i in index.items()}
