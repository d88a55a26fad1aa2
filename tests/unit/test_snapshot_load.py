"""Tensors parsed from a snapshot's verified bytes: the publisher's safetensors files round-trip as views
over the buffer (no copy, nothing unpickled), and a malformed header or entry is refused."""

from __future__ import annotations

import io
import json
import struct

import pytest
import torch

from searchr1.weightsync import SnapshotError, snapshot_tensors, write_safetensors
from searchr1.weightsync.safetensors import safetensors_tensors


def _file(tensors) -> memoryview:
    buf = io.BytesIO()
    write_safetensors(buf, tensors)
    return memoryview(bytearray(buf.getvalue()))


def test_the_publishers_file_round_trips_as_views_over_the_buffer():
    tensors = {"w": torch.randn(3, 4).to(torch.bfloat16), "i": torch.arange(5, dtype=torch.int64),
               "b": torch.tensor([True, False]), "s": torch.tensor(2.5), "e": torch.zeros(0, 3)}
    raw = _file(tensors)
    got = dict(safetensors_tensors(raw))
    assert got.keys() == tensors.keys()
    assert all(got[k].dtype == tensors[k].dtype and torch.equal(got[k], tensors[k]) for k in tensors)
    (n,) = struct.unpack("<Q", raw[:8])
    start = json.loads(bytes(raw[8:8 + n]))["w"]["data_offsets"][0]
    raw[8 + n + start] ^= 0xFF  # a view, not a copy: the buffer's change shows
    assert not torch.equal(got["w"], tensors["w"])
    files = {"model.safetensors": raw, "config.json": memoryview(b"{}")}
    assert [name for name, _ in snapshot_tensors(files)] == [name for name, _ in safetensors_tensors(raw)]


def _with_header(header: dict, data: bytes = b"\0" * 16) -> memoryview:
    h = json.dumps(header).encode()
    return memoryview(struct.pack("<Q", len(h)) + h + data)


@pytest.mark.parametrize("raw, why", [
    (memoryview(b"\x05\0\0\0\0\0\0\0{nope"), "malformed safetensors header"),
    (_with_header({"t": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}), "offsets"),
    (_with_header({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}), "offsets"),
    (_with_header({"t": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}), "malformed entry"),
    (_with_header({"t": {"dtype": "F32", "shape": "x", "data_offsets": [0, 4]}}), "malformed entry"),
])
def test_a_malformed_file_is_refused(raw, why):
    with pytest.raises(SnapshotError, match=why):
        list(safetensors_tensors(raw))
