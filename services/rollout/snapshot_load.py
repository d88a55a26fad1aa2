"""Tensors from a snapshot's verified bytes (docs/architecture.md, "Weight sync"): the engines read a snapshot
with `core.snapshot_read.read_verified` (every chunk checked against the announced digest as it is read)
and build their tensors over those same bytes here, so what they load is what was verified — never the
files again.

`safetensors_tensors` parses the safetensors format itself (an 8-byte little-endian header length, a JSON
header of dtype, shape and byte offsets per tensor, then the data; nothing is unpickled) and returns views
over the buffer, no copy: the engine's own load copies them into its parameters.
"""

from __future__ import annotations

import json
import math
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from searchr1.core.snapshot_manifest import SnapshotError
from searchr1.core.snapshot_read import read_verified

_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
           "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
"""safetensors dtype code → torch dtype name."""


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


@dataclass
class LoadTimes:
    """Where a verified snapshot load spent its time (seconds)."""

    read_verify: float = 0.0
    """Reading every byte into memory with its chunk digests checked (`read_verified`)."""
    load_weights: float = 0.0
    """The engine's own load from those bytes (vLLM's `load_weights` through `reload_weights`)."""
    gemm_repack: float = 0.0
    """vLLM CPU: re-packing the GEMM of the layers that keep their weight (`broadcast_ext.refresh_cpu_gemm`)."""
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        return {"read_verify_s": self.read_verify, "load_weights_s": self.load_weights,
                "gemm_repack_s": self.gemm_repack, **self.extra}


def read_timed(path: str, digest: str, times: LoadTimes) -> dict[str, memoryview]:
    """`read_verified(path, digest)`, its seconds recorded in `times.read_verify`."""
    t0 = time.perf_counter()
    files = read_verified(path, digest)
    times.read_verify = time.perf_counter() - t0
    return files
