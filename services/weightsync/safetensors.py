"""The safetensors format, both ways (docs/architecture.md, "Weight sync"): the publisher streams a state
dict into `model.safetensors` tensor by tensor (`write_safetensors`, what `safetensors.torch.save_file`
writes, each piece handed to the chunk hasher beside the write: no serialised copy of the whole state dict
in memory), and the engines build their tensors over a snapshot's verified bytes (`snapshot_tensors`: the
bytes `read.read_verified` checked against the announced digest, never the files again).

The format: an 8-byte little-endian header length, a JSON header of dtype, shape and byte offsets per
tensor (data order: widest element first, then by name, as the safetensors library lays them out, so
every tensor is aligned to its element size), then the data. Reading parses it here (nothing is unpickled)
and returns views over the buffer, no copy: the engine's own load copies them into its parameters. torch
is imported inside the functions (the learner and the engines have it).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from searchr1.weightsync.manifest import SnapshotError

_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
          "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
          "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
"""torch dtype name → safetensors dtype code."""
_DTYPES = {code: name for name, code in _CODES.items()}
"""safetensors dtype code → torch dtype name."""


def _flat_bytes(tensor: Any) -> memoryview:
    """The tensor's bytes without a copy (a CPU, contiguous tensor; others are copied to one first)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    import torch

    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def safetensors_header(tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> tuple[bytes, list[str]]:
    """(the safetensors header: 8-byte little-endian length + JSON, padded to 8 bytes; tensor names in
    data order: widest element first, then by name, as the safetensors library lays them out, so every
    tensor is aligned to its element size). Raises `ValueError` for a dtype safetensors cannot hold."""
    meta: dict[str, Any] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    offset = 0
    for name in order:
        t = tensors[name]
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _CODES:
            raise ValueError(f"tensor {name!r} has dtype {dtype}, which safetensors cannot hold")
        size = t.numel() * t.element_size()
        meta[name] = {"dtype": _CODES[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(meta, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header, order


def write_safetensors(f: BinaryIO, tensors: dict[str, Any], feed: Callable[[memoryview], None] | None = None,
                      metadata: dict[str, str] | None = None) -> int:
    """Stream `tensors` into `f` in the safetensors format (what `safetensors.torch.save_file` writes),
    handing every piece written to `feed` too (a `ChunkHasher`, which hashes in its pool while the next
    piece is written); `metadata` goes into the header's `__metadata__`. Returns the bytes written.
    Blocking: run it in a thread."""
    header, order = safetensors_header(tensors, metadata)
    written = 0
    for i in range(len(order) + 1):
        data = memoryview(header) if i == 0 else _flat_bytes(tensors[order[i - 1]])
        if feed is not None:
            feed(data)
        f.write(data)
        written += len(data)
    return written


def safetensors_bytes(tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> bytes:
    """`tensors` as one safetensors file in memory (`write_safetensors` into a buffer). Blocking."""
    import io

    buf = io.BytesIO()
    write_safetensors(buf, tensors, metadata=metadata)
    return buf.getvalue()


def safetensors_metadata(buf: memoryview) -> dict[str, str]:
    """The `__metadata__` of the safetensors file in `buf` ({} when it has none or is malformed: the
    tensors are checked by `safetensors_tensors`)."""
    try:
        (n,) = struct.unpack("<Q", buf[:8])
        meta = json.loads(bytes(buf[8:8 + n])).get("__metadata__") or {}
    except (struct.error, ValueError, TypeError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


def safetensors_tensors(buf: memoryview) -> Iterator[tuple[str, Any]]:
    """(name, tensor) for every tensor of the safetensors file in `buf`, in data order, each a view over
    `buf`. Raises `SnapshotError` for a malformed file (a header that does not parse, an unknown dtype,
    offsets outside the data or disagreeing with the shape)."""
    import torch

    try:
        (n,) = struct.unpack("<Q", buf[:8])
        header = json.loads(bytes(buf[8:8 + n]))
        specs = sorted(((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0])
    except (struct.error, ValueError, TypeError, KeyError) as exc:
        raise SnapshotError(f"malformed safetensors header: {exc}") from exc
    base = 8 + n
    for name, spec in specs:
        try:
            dtype = getattr(torch, _DTYPES[spec["dtype"]])
            shape = [int(d) for d in spec["shape"]]
            start, end = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SnapshotError(f"tensor {name!r}: malformed entry {spec!r}") from exc
        count = math.prod(shape)
        if end - start != count * dtype.itemsize or not 0 <= start <= end <= len(buf) - base:
            raise SnapshotError(f"tensor {name!r}: offsets {start}–{end} do not hold {shape} {spec['dtype']}")
        t = torch.frombuffer(buf, dtype=dtype, count=count, offset=base + start) if count else torch.empty(0, dtype=dtype)
        yield name, t.reshape(shape)


def snapshot_tensors(files: dict[str, memoryview]) -> Iterator[tuple[str, Any]]:
    """Every tensor of every `.safetensors` file among `files` (name → verified bytes), files in sorted order."""
    for name in sorted(files):
        if name.endswith(".safetensors"):
            yield from safetensors_tensors(files[name])
