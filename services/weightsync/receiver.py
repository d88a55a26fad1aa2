"""A broadcast receiver rank (`broadcast.py`'s other side; inside a rollout engine's worker process): joins
a generation (`rendezvous.join_generation`), then receives each publication full or as a delta.

- Full: the tensors are yielded bucket by bucket as they arrive (bucket k+1 is on the wire while bucket k
  is hashed and handed out), the in-band digest and signature checked after the last one.
- Delta (`keep_base=True` only): a receiver that keeps a copy of the version it holds (`apply.BaseWeights`,
  host memory, kept from the last full version it received) tells the learner which version that is (the
  all-reduce that opens every version); when every member holds the delta's base the learner sends the
  delta file's bytes (the encoding snapshot deltas use), which are checked against the digest and the
  signature, then applied to the copy with the checksum of every resulting tensor verified
  (`BaseWeights.apply`); every tensor of the version is then yielded (vLLM's in-place reload loads a layer
  once all of its tensors arrived). A delta against another version or one whose result fails a checksum
  is refused (`DeltaRefused`) and the copy dropped, so the next version comes full.

A refusal after the version's last collective (a digest, a delta) keeps the receiver in the group — it
holds no newer version, so the next one goes out full — and the worker catches up from the latest
snapshot meanwhile; any other failure leaves the group (the worker joins the next generation).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterator
from typing import Any

import xxhash

from searchr1.weightsync import rendezvous
from searchr1.weightsync.apply import BaseWeights
from searchr1.weightsync.broadcast import (
    _DIGEST_BYTES,
    _MAC_BYTES,
    BroadcastFailed,
    GroupAddress,
    _group,
    _post,
    _store,
    _wait,
    broadcast_bytes,
    broadcast_tensor,
    mac,
    min_of,
)
from searchr1.weightsync.buckets import DigestMismatch, bucket_bytes_of, hash_into, unpack_bucket
from searchr1.weightsync.delta import Delta, DeltaRefused


class Receiver:
    """A receiver rank: joins a generation's group, then yields each publication's tensors. Blocking."""

    def __init__(self, *, backend: str, timeout_s: float = 60.0, device: str | None = None,
                 key: bytes = b"", keep_base: bool = False) -> None:
        """`device`: where received tensors land (None: host memory). `keep_base`: keep a host copy of the
        last full version received (one copy of the weights, in the published dtype) so later versions
        can come as deltas."""
        self.backend, self.timeout_s, self.device = backend, timeout_s, device or "cpu"
        self._key = key
        self.keep_base = keep_base
        self.base: BaseWeights | None = None
        """The copy of the version this receiver holds (None: none, so every version comes full)."""
        self.address: GroupAddress | None = None
        self.rank: int | None = None
        self.last_digest: str | None = None
        self.last_form = ""
        """How the last version arrived: `full` or `delta`."""
        self._store: Any = None
        self._pg: Any = None

    def join(self, addr: GroupAddress) -> int:
        """Join `addr`'s generation; returns this receiver's rank. `BroadcastFailed` when the generation is
        full or already closed (a late joiner: it catches up from a snapshot and joins the next one)."""
        self.leave()
        store = _store(addr.host, addr.port, self.timeout_s, is_master=False)
        try:
            rank, world = rendezvous.join_generation(store, addr.generation, addr.world_size - 1)
        except rendezvous.Refused as exc:
            raise BroadcastFailed(str(exc)) from exc
        except (RuntimeError, OSError) as exc:
            raise BroadcastFailed(f"joining weight group {addr} failed: {exc}") from exc
        self._pg = _group(store, addr, rank, world, self.backend, self.timeout_s)
        self._store, self.address, self.rank = store, addr, rank
        return rank

    def leave(self) -> None:
        self._pg = self._store = self.address = self.rank = None

    def drop_base(self) -> None:
        """Forget the held copy (the engine now runs other weights, e.g. a snapshot): the next version comes full."""
        self.base = None

    def receive(self, version: int) -> Iterator[tuple[str, Any]]:
        """Yield (name, tensor) of the publication `version`; after the last, check the digest
        (`DigestMismatch`) and keep it in `last_digest`. A delta is applied to the held copy before
        anything is yielded (`DeltaRefused`). A failure before the version's last collective leaves the group."""
        if self._pg is None:
            raise BroadcastFailed("not in a weight group")
        done = [False]
        try:
            yield from self._receive(version, done)
        except (BroadcastFailed, DigestMismatch):
            if not done[0]:
                self.leave()
            raise

    def _check(self, signed: bytes, raw_header: bytes, digest: Any, version: int) -> None:
        got = digest.hexdigest()
        if signed[:_DIGEST_BYTES].hex() != got:
            raise DigestMismatch(f"received tensors' digest {got} differs from the sender's")
        if not hmac.compare_digest(signed[_DIGEST_BYTES:], mac(self._key, raw_header, digest.digest())):
            self.leave()  # a sender without the run's key: never trust this group again
            raise DigestMismatch(f"version {version} is not signed with the run's key (a sender without the "
                                 f"weight token took rank 0): rejected")
        self.last_digest = got

    def _signature(self) -> bytes:
        import torch

        sent = torch.empty(_DIGEST_BYTES + _MAC_BYTES, dtype=torch.uint8, device=self.device)
        broadcast_tensor(self._pg, sent)
        return bytes(sent.cpu().numpy())

    def _receive(self, version: int, done: list[bool]) -> Iterator[tuple[str, Any]]:
        held = self.base.version if self.keep_base and self.base is not None else -1
        min_of(self._pg, held, self.device)
        raw_header = broadcast_bytes(self._pg, None, self.device)
        header = json.loads(raw_header)
        if header["version"] != version:
            raise DigestMismatch(f"expected version {version}, the group sent {header['version']}")
        if header.get("form") == "delta":
            yield from self._receive_delta(version, header, raw_header, done)
        else:
            yield from self._receive_full(version, header, raw_header, done)

    def _receive_delta(self, version: int, header: dict, raw_header: bytes,
                       done: list[bool]) -> Iterator[tuple[str, Any]]:
        import torch

        buf = torch.empty(int(header["bytes"]), dtype=torch.uint8, device=self.device)
        broadcast_tensor(self._pg, buf)
        signed = self._signature()
        done[0] = True
        data: Any = buf.cpu()
        digest = xxhash.xxh3_128()
        hash_into(data, digest)
        self._check(signed, raw_header, digest, version)
        self.last_form = "delta"
        base = self.base
        try:
            if base is None or base.version != int(header["base"]):
                held = "none" if base is None else base.version
                raise DeltaRefused(f"delta {header['base']}→{version} does not apply to the version held ({held}): "
                                   f"out of order")
            delta = Delta.parse(memoryview(data.numpy()))
            if delta.header.base != base.version or delta.header.version != version:
                raise DeltaRefused(f"delta {delta.header.base}→{delta.header.version} sent as "
                                   f"{header['base']}→{version}: out of order")
            base.apply(delta)  # every resulting tensor checked; undone on any mismatch
        except DeltaRefused:
            self.base = None  # the copy is not to be trusted: the next version comes full
            raise
        yield from sorted(base.tensors.items())

    def _receive_full(self, version: int, header: dict, raw_header: bytes,
                      done: list[bool]) -> Iterator[tuple[str, Any]]:
        import torch

        self.base = None  # the held copy is replaced by this version (kept once it verified)
        digest = xxhash.xxh3_128()
        kept: list[tuple[str, Any]] = []
        # each bucket has its own buffer, so the views handed out stay valid however long the caller keeps them
        plan = header["buckets"]
        flat = torch.empty(bucket_bytes_of(plan[0]), dtype=torch.uint8, device=self.device) if plan else None
        work = _post(self._pg, flat) if plan else None
        for k, specs in enumerate(plan):
            _wait(work)
            cur = flat
            if k + 1 < len(plan):
                flat = torch.empty(bucket_bytes_of(plan[k + 1]), dtype=torch.uint8, device=self.device)
                work = _post(self._pg, flat)
            hash_into(cur, digest)
            tensors = unpack_bucket(cur, specs)
            if self.keep_base:  # a host copy, apart from what the engine loads
                kept.extend((n, t.cpu().clone()) if t.device.type != "cpu" else (n, t) for n, t in tensors)
            yield from tensors
        signed = self._signature()
        done[0] = True
        self._check(signed, raw_header, digest, version)
        self.last_form = "full"
        if self.keep_base:
            self.base = BaseWeights.of(kept, version, header.get("sums"))
