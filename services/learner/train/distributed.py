"""Data-parallel plumbing of the learner process: joining the torchrun process group and moving a
step's groups from rank 0 (the only rank talking to Redis) to every other rank.

Groups travel as msgpack bytes of their wire encoding in a uint8 tensor (never pickle), over gloo or
NCCL. Every function here is blocking and, from an event loop, is run in a thread
(`asyncio.to_thread`) so that a rank waiting in a collective does not stall its loop (on rank 0, the
dispatcher runs on the same loop). Collectives are issued one at a time and in the same order on every
rank: each is awaited before the next stage starts.
"""

from __future__ import annotations

import os

import msgpack
import torch
import torch.distributed as dist

from searchr1.core.schemas import TrajectoryGroup, decode, encode
from searchr1.learner.train.model import DistInfo, dist_info


def init_distributed() -> DistInfo:
    """Join the torchrun process group when launched with WORLD_SIZE > 1 (gloo on CPU, NCCL on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return dist_info()


def broadcast_groups(groups: list[TrajectoryGroup] | None, info: DistInfo) -> list[TrajectoryGroup] | None:
    """Rank 0's groups on every rank (None = stop). msgpack bytes in a uint8 tensor; gloo or NCCL."""
    if not info.enabled:
        return groups
    device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
    if info.is_main:
        payload = b"" if groups is None else msgpack.packb([encode(g) for g in groups], use_bin_type=True)
        size = torch.tensor([len(payload) if groups is not None else -1], dtype=torch.long, device=device)
    else:
        size = torch.zeros(1, dtype=torch.long, device=device)
    dist.broadcast(size, 0)
    n = int(size.item())
    if n < 0:
        return None
    buf = (torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device) if info.is_main
           else torch.empty(n, dtype=torch.uint8, device=device))
    if n:
        dist.broadcast(buf, 0)
    if info.is_main:
        return groups
    return [decode(TrajectoryGroup, raw) for raw in msgpack.unpackb(buf.cpu().numpy().tobytes(), raw=False)]
