"""Starting and ending a gloo process group in a test's spawned ranks."""

from __future__ import annotations

import os


def join_group(rank: int, world: int, port: int) -> None:
    """Join a gloo group of `world` ranks on loopback (a no-op for one rank)."""
    if world > 1:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)


def leave_group(world: int) -> None:
    """End the group together: a rank that tears its gloo group down while a peer is still working on
    the last collective's buffers (rank 0 writing what the others gathered to it) can abort in gloo's
    transport threads ("terminate called without an active exception"), so all ranks meet first."""
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
