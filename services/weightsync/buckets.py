"""The bucket layout of a broadcast publication (`broadcast.py`): which tensors share a bucket,
how they are packed into one flat uint8 tensor and read back out of it.

Tensors go into buckets of at most `bucket_bytes` in order (`plan_buckets`; a bigger tensor gets a bucket
of its own); inside a bucket each starts at a multiple of 16 bytes (`ALIGN`), the padding zeroed, so every
view the receiver hands out is aligned. The header's specs (name, dtype, shape) say where each tensor is
(`unpack_bucket`); the sender's and receiver's xxh3 digest is updated with each packed bucket as it is
packed or received (`hash_into`). Pure layout, no process group: torch is imported inside the functions,
which run only where torch is installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

ALIGN = 16
"""Every tensor starts at a multiple of this many bytes in its bucket (so each view is aligned)."""


class DigestMismatch(RuntimeError):
    """The received tensors' digest differs from the sender's: the version is rejected."""


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Group tensor indices into buckets of at most `bucket_bytes` (a bigger tensor gets a bucket of its
    own), order kept."""
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    buckets: list[list[int]] = []
    used = bucket_bytes
    for i, n in enumerate(sizes):
        if used + n > bucket_bytes or not buckets:
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += n
    return buckets


def tensor_nbytes(t: Any) -> int:
    """Bytes of one tensor's data."""
    return t.numel() * t.element_size()


def padded(n: int) -> int:
    """`n` rounded up to the alignment."""
    return -(-n // ALIGN) * ALIGN


def spec_bytes(spec: dict[str, Any]) -> int:
    """Bytes of one header spec's tensor (unpadded)."""
    import torch

    return torch.Size(spec["shape"]).numel() * torch.empty((), dtype=getattr(torch, spec["dtype"])).element_size()


def bucket_bytes_of(specs: Sequence[dict[str, Any]]) -> int:
    """Bytes of the packed bucket that holds `specs` (each tensor padded to the alignment)."""
    return sum(padded(spec_bytes(s)) for s in specs)


def pack_bucket(tensors: Sequence[Any], digest: Any, out: Any = None) -> Any:
    """Tensors → one flat uint8 tensor on their device (copied back to back, each padded to 16 bytes with
    zeros); `digest` is updated with the packed bytes (on CPU; a device bucket is copied to host for the
    hash). `out`: a uint8 buffer at least that long to pack into (its first bytes are returned), else a
    new one. Only the padding is zeroed: every other byte is written once."""
    import torch

    total = sum(padded(tensor_nbytes(t)) for t in tensors)
    device = tensors[0].device if tensors else torch.device("cpu")
    flat = torch.empty(total, dtype=torch.uint8, device=device) if out is None else out[:total]
    off = 0
    for t in tensors:
        n = tensor_nbytes(t)
        flat[off:off + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
        if padded(n) > n:
            flat[off + n:off + padded(n)].zero_()
        off += padded(n)
    hash_into(flat, digest)
    return flat


def hash_into(flat: Any, digest: Any) -> None:
    """Update `digest` with a packed bucket's bytes (copied to host first when it is on a device)."""
    host = flat if flat.device.type == "cpu" else flat.cpu()
    digest.update(memoryview(host.numpy()))


def unpack_bucket(flat: Any, specs: Sequence[dict[str, Any]]) -> list[tuple[str, Any]]:
    """A received bucket → (name, tensor) views into it, per the header's specs (name, dtype, shape)."""
    import torch

    if bucket_bytes_of(specs) != flat.numel():
        raise DigestMismatch(f"bucket holds {flat.numel()} bytes, its specs {bucket_bytes_of(specs)}")
    out, off = [], 0
    for spec in specs:
        n = spec_bytes(spec)
        out.append((spec["name"], flat[off:off + n].view(getattr(torch, spec["dtype"])).reshape(tuple(spec["shape"]))))
        off += padded(n)
    return out
