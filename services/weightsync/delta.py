"""Weight deltas: what changed between two published versions, how it is encoded, and how a worker applies
it to the version it runs and checks the result (docs/architecture.md, "Weight sync").

With fp32 master weights published in bf16, an update moves a published value only where its master
crossed a rounding boundary: a few percent of the values a step at lr 1e-6 (docs/learner.md, "Precision").
A delta carries exactly those values:

- `diff(previous, current)`: per tensor, the flat positions whose *bits* differ (+0/−0 and NaN payloads
  count as stored) and the new values there — absolute values, never differences, so a chain of deltas
  reproduces the publisher's tensors bit for bit however long it is;
- `encode_patches`: per changed tensor two byte segments, the positions as 32-bit gaps (the first gap is
  the first position; every later one ≥ 1) and the values in the published dtype, each compressed with
  zstd (`codec = "zstd"`) or kept raw (`"raw"`); measured against an xor of the two versions through the
  same compressor, which compresses as well but makes a worker decompress and xor the whole model
  (docs/performance.md, "Weight deltas");
- `checksum`: xxh3-64 of a tensor's bytes. A delta lists the checksum of every tensor of the version it
  produces — of the *resulting* tensor, not of the patch — so a worker checks what it now holds, and a
  delta applied to any other base than its own fails the check on every tensor it touches;
- `BaseWeights` (`apply.py`): a worker's copy of the published tensors of the version it runs (host memory,
  the published dtype, the publisher's names) with their checksums. `apply` refuses a delta made against
  another version before touching anything, applies each patch in place keeping the values it overwrote,
  checks each resulting tensor, and on any mismatch puts every value back and raises `DeltaRefused`: the
  copy is then exactly the version it was.

The delta file (`DELTA_FILE`, beside a manifest like any snapshot's) is a safetensors file whose
tensors are the segments (uint8, `{name}:idx` and `{name}:val`) and whose metadata `searchr1_delta` is the
JSON `DeltaHeader`; it is fetched and read verified (BLAKE3 per chunk, sha256 over the manifest) like a
full snapshot, so only the publisher's bytes are decoded. The name does not end in `.safetensors`: nothing
that loads a model directory mistakes a delta for weights.

Pure functions over torch tensors (torch imported inside, as everywhere in this package), no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import xxhash

from searchr1.weightsync.manifest import SnapshotError

DELTA_FILE = "model.delta"
"""The delta's file in a delta directory (safetensors format; see the module docstring)."""
FORMAT = 1
Codec = Literal["zstd", "raw"]
_MAX_NUMEL = (1 << 32) - 1
"""Positions are stored as 32-bit gaps: a tensor with more elements is always sent whole."""
_BITS: dict[int, str] = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


class DeltaRefused(SnapshotError):
    """A delta that cannot be applied to the weights a worker holds: made against another version (out of
    order), malformed, or whose resulting tensors do not match their checksums. The weights are as they
    were; the worker falls back to the newest full version."""


def _bytes(t: Any) -> memoryview:
    """A CPU tensor's bytes without a copy (copied to a contiguous CPU tensor first when it is not one)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def checksum(t: Any) -> str:
    """xxh3-64 of the tensor's bytes, hex (what a delta lists for each resulting tensor)."""
    return xxhash.xxh3_64_hexdigest(_bytes(t))


def checksums(state: Mapping[str, Any]) -> dict[str, str]:
    return {name: checksum(t) for name, t in state.items()}


def as_bits(t: Any) -> Any:
    import torch

    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    return flat.view(getattr(torch, _BITS[flat.element_size()]))


def changed_positions(previous: Any, current: Any) -> Any:
    """The flat positions (int64, ascending) where `current`'s bits differ from `previous`'s (same shape
    and dtype). numpy's `flatnonzero` (one pass over the comparison): torch's `nonzero` took 5× the CPU
    time for the same positions on these cores."""
    import numpy as np
    import torch

    a, b = as_bits(previous).cpu().numpy(), as_bits(current).cpu().numpy()
    return torch.from_numpy(np.flatnonzero(a != b).astype(np.int64, copy=False))


@dataclass(frozen=True, slots=True)
class Patch:
    """One tensor's change: the new `values` at the flat `positions` (int64, ascending)."""

    name: str
    positions: Any
    values: Any


@dataclass(frozen=True, slots=True)
class Diff:
    """What changed from one version's tensors to the next's."""

    patches: list[Patch]
    changed: int
    """Values whose bits differ."""
    total: int
    """Values in the version."""

    @property
    def density(self) -> float:
        """The share of published values that changed (`published_changed_frac`)."""
        return self.changed / max(self.total, 1)


def comparable(previous: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether a delta can express `current` against `previous`: the same names, each with the same shape
    and dtype and at most 2³²−1 elements."""
    if previous.keys() != current.keys():
        return False
    return all(previous[k].shape == t.shape and previous[k].dtype == t.dtype and t.numel() <= _MAX_NUMEL
               for k, t in current.items())


def diff(previous: Mapping[str, Any], current: Mapping[str, Any]) -> Diff | None:
    """The patches that turn `previous` into `current` (unchanged tensors have none), or None when no delta
    can express it (`comparable`). Blocking (a pass over both versions): run it in a thread."""
    if not comparable(previous, current):
        return None
    patches, changed, total = [], 0, 0
    import numpy as np
    import torch

    for name in sorted(current):
        cur = current[name]
        total += cur.numel()
        bits = as_bits(cur).cpu().numpy()
        pos = np.flatnonzero(as_bits(previous[name]).cpu().numpy() != bits)
        if len(pos):
            values = torch.from_numpy(bits[pos]).view(cur.dtype)  # the new values, gathered as bits
            patches.append(Patch(name, torch.from_numpy(pos.astype(np.int64, copy=False)), values))
            changed += len(pos)
    return Diff(patches, changed, total)


# ------------------------------------------------------------------------------------- the wire


def _compress(data: memoryview | bytes, codec: Codec) -> bytes | memoryview:
    if codec == "raw":
        return data
    import zstandard

    return zstandard.ZstdCompressor(level=1).compress(data)


def _decompress(data: memoryview, codec: str, size: int) -> bytes | memoryview:
    if codec == "raw":
        if len(data) != size:
            raise DeltaRefused(f"a raw segment of {len(data)} bytes where {size} were expected")
        return data
    if codec != "zstd":
        raise DeltaRefused(f"unknown delta codec {codec!r}")
    import zstandard

    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise DeltaRefused(f"a segment does not decompress: {exc}") from exc
    if len(out) != size:
        raise DeltaRefused(f"a segment decompressed to {len(out)} bytes where {size} were expected")
    return out


def gaps(positions: Any) -> Any:
    """Ascending int64 positions → their gaps as uint32 (numpy; the first gap is the first position)."""
    import numpy as np

    p = positions.numpy()
    g = np.empty(len(p), dtype=np.uint32)
    if len(p):
        g[0] = p[0]
        np.subtract(p[1:], p[:-1], out=g[1:], casting="unsafe")
    return g


def positions_of(gap_bytes: bytes | memoryview, numel: int) -> Any:
    """`gaps`' inverse from their bytes, checked: every position inside the tensor, strictly ascending
    (int64 torch tensor)."""
    import numpy as np
    import torch

    g = np.frombuffer(gap_bytes, dtype=np.uint32)
    if len(g) > 1 and not g[1:].all():
        raise DeltaRefused("positions repeat (a gap of 0)")
    pos = np.cumsum(g, dtype=np.int64)
    if len(pos) and int(pos[-1]) >= numel:
        raise DeltaRefused(f"a position past the tensor's {numel} elements")
    return torch.from_numpy(pos)


@dataclass
class DeltaHeader:
    """The delta's description (JSON in the file's metadata)."""

    base: int
    """The version this delta applies to."""
    version: int
    """The version it produces."""
    codec: str
    tensors: dict[str, dict[str, Any]]
    """Every tensor of the resulting version: {"dtype", "shape", "checksum"} and, for a changed one,
    "count" (values changed) and "sizes" (the decoded bytes of its gap and value segments)."""

    def encode(self) -> str:
        return json.dumps({"format": FORMAT, "base": self.base, "version": self.version, "codec": self.codec,
                           "tensors": self.tensors}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, raw: str) -> DeltaHeader:
        try:
            doc = json.loads(raw)
            if doc["format"] != FORMAT:
                raise ValueError(f"format {doc['format']!r}")
            header = cls(int(doc["base"]), int(doc["version"]), str(doc["codec"]), dict(doc["tensors"]))
            for name, spec in header.tensors.items():
                if not isinstance(spec, dict) or not {"dtype", "shape", "checksum"} <= spec.keys():
                    raise ValueError(f"tensor {name!r}: {spec!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise DeltaRefused(f"malformed delta header: {exc}") from exc
        return header


def encode_patches(d: Diff, current: Mapping[str, Any], *, base: int, version: int, codec: Codec,
                   sums: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(the delta file's tensors: uint8 segments `{name}:idx` and `{name}:val`, its metadata): the patches
    of `d`, with the checksum of every tensor of `current` (`sums` when already computed). Blocking."""
    import torch

    sums = dict(sums) if sums is not None else checksums(current)
    tensors: dict[str, Any] = {}
    specs: dict[str, dict[str, Any]] = {
        name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "checksum": sums[name]}
        for name, t in current.items()}
    for p in d.patches:
        idx, val = memoryview(gaps(p.positions)).cast("B"), _bytes(p.values)
        specs[p.name].update(count=int(p.positions.numel()), sizes=[len(idx), len(val)])
        for suffix, raw in ((":idx", idx), (":val", val)):
            packed = _compress(raw, codec)
            tensors[p.name + suffix] = torch.frombuffer(bytearray(packed), dtype=torch.uint8) if len(packed) \
                else torch.empty(0, dtype=torch.uint8)
    header = DeltaHeader(base, version, codec, specs)
    return tensors, {"searchr1_delta": header.encode()}


def delta_header(buf: memoryview) -> DeltaHeader:
    """The header of the delta file in `buf` (its safetensors metadata)."""
    import struct

    try:
        (n,) = struct.unpack("<Q", buf[:8])
        meta = json.loads(bytes(buf[8:8 + n])).get("__metadata__", {})
        return DeltaHeader.parse(meta["searchr1_delta"])
    except (struct.error, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DeltaRefused(f"not a delta file: {exc}") from exc


@dataclass
class Delta:
    """A delta file, parsed: its header and its segments (views over the verified bytes)."""

    header: DeltaHeader
    segments: dict[str, Any]

    @classmethod
    def parse(cls, buf: memoryview) -> Delta:
        from searchr1.weightsync.safetensors import safetensors_tensors

        header = delta_header(buf)
        segments = dict(safetensors_tensors(buf))
        return cls(header, segments)

    def patches(self, like: Mapping[str, Any]) -> Iterator[Patch]:
        """Each changed tensor's decoded patch, checked against the header and against `like` (the
        tensors the delta applies to: their dtype and shape). Raises `DeltaRefused`."""
        import torch

        for name, spec in sorted(self.header.tensors.items()):
            if "count" not in spec:
                continue
            target = like.get(name)
            if target is None:
                raise DeltaRefused(f"the delta changes {name!r}, which the weights do not have")
            count = int(spec["count"])
            sizes = spec.get("sizes")
            if not (isinstance(sizes, list) and len(sizes) == 2 and sizes[0] == 4 * count
                    and sizes[1] == count * target.element_size()):
                raise DeltaRefused(f"{name}: segment sizes {sizes!r} do not fit {count} values")
            try:
                idx, val = self.segments[name + ":idx"], self.segments[name + ":val"]
            except KeyError as exc:
                raise DeltaRefused(f"{name}: a segment is missing") from exc
            raw_idx = _decompress(_bytes(idx), self.header.codec, sizes[0])
            raw_val = _decompress(_bytes(val), self.header.codec, sizes[1])
            values = (torch.frombuffer(bytearray(raw_val), dtype=torch.uint8).view(target.dtype) if count
                      else torch.empty(0, dtype=target.dtype))
            yield Patch(name, positions_of(raw_idx, target.numel()), values)
