"""Weights pushed in memory over a process group (the `broadcast` weight transport; docs/architecture.md,
"Weight sync"): the learner is rank 0, each rollout engine one receiver rank; nothing is written to disk.

One publication on the wire, every message a collective from rank 0 over a torch.distributed process
group (gloo on CPU, NCCL on GPU), built without the default group (a `TCPStore` the learner serves plus
`ProcessGroupGloo`/`ProcessGroupNCCL` directly), so it lives beside the vLLM worker's own groups:

    held (int64[1], an all-reduce MIN: the version every receiver holds a copy of, −1 for none)
    → header length (int64[1]) → header (uint8 JSON: version, form, and for `full` the tensor names,
      dtypes, shapes, bucket plan and each tensor's checksum; for `delta` its base and byte count)
    → full: bucket 0 … bucket n-1 (uint8, about `bucket_bytes` each, tensors back to back at 16-byte
      offsets); delta: the delta file's bytes (`delta.py`'s encoding: changed positions and values in the
      published dtype, the checksum of every resulting tensor)
    → digest (uint8[48]: xxh3-128 over the payload, then HMAC-SHA256 of header + that xxh3 digest, keyed
      by the run's secret)

A version goes out as a delta only when the learner has one against the version before (`versions.py`:
under `max_share` of the full bytes) and every member holds that version (the all-reduce); otherwise
whole. The receiver's side (checks, the delta applied and verified) is `receiver.py`.

The sender hashes each bucket as it packs it and the receiver as it receives it (one pass each, no
read-back); both overlap that work with the wire: the sender packs bucket k into one of two buffers
while bucket k-1 is in flight, the receiver posts bucket k+1 before it hashes and hands out bucket k; a
receiver whose digest differs rejects the version. The hash is xxh3-128 (6.5 GB/s on one
core of the 2-core test machine, against 0.8 GB/s for sha256, which at 0.5B cost more than the transfer):
it guards the transfer against corruption and truncation. The HMAC authenticates it: a process that took
rank 0 without the run's secret (`key`, the weight token; `SEARCHR1_WEIGHTS_KEY` inside an engine) cannot
sign what it sends, and the receiver rejects the version. The store listens only on the configured
address (a socket bound here and handed to `TCPStore`), not on every interface.

Membership (`rendezvous.py`): a generation forms from the receivers that joined it — the first waits at
most `timeout_s` for every configured receiver, each later one at most `join_window_s` — so a receiver
that stopped or died costs the learner the timeout of the version in flight, not of every version after.
Every collective waits at most `timeout_s`: a dead or stopped member makes the sender's `send` raise
`BroadcastFailed` instead of hanging, and the group is then unusable — the sender forms a fresh
generation (`generation` + 1, its own key prefix in the store) for the next version. Receivers that
missed a version catch up from the latest snapshot, which the learner still writes every N versions and
after a failed send; one refused by a closed generation is let into the next (`Broadcaster.refresh`; after
a re-formation that still left the group short, the next waits 1, 2, 4 … 64 versions).

The group URI (`broadcast://host:port/generation/world`) travels in `WeightVersion.uri`, so the
announcement stays the contract.

Pure helpers carry the layout: `group_uri`, `parse_group_uri` here, and the bucket packing (`plan_buckets`,
`pack_bucket`, `unpack_bucket`) in `buckets.py`; `broadcast_tensor`, `broadcast_bytes` and `min_of` are the
messages every publication is made of; `Broadcaster` (rank 0) carries the group.
torch is imported inside the functions, which run only in the learner and in a rollout engine's worker
(both have torch): importing the module needs no torch.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import xxhash

from searchr1.weightsync import rendezvous
from searchr1.weightsync.buckets import pack_bucket, padded, plan_buckets, tensor_nbytes

SCHEME = "broadcast"
_DIGEST_BYTES = 16
"""xxh3-128 of the packed buckets: an integrity check of the transfer."""
_MAC_BYTES = 32
"""HMAC-SHA256 of the header and the xxh3 digest, keyed by the run's secret: who sent it."""
WEIGHTS_KEY_ENV = "SEARCHR1_WEIGHTS_KEY"
"""The environment variable that hands the run's secret to the receiver inside an engine's worker."""


def mac(key: bytes, header: bytes, digest: bytes) -> bytes:
    """The signature the sender appends and the receiver checks."""
    return hmac.new(key, len(header).to_bytes(8, "big") + header + digest, hashlib.sha256).digest()


_STORE_TIMEOUT_PAD_S = 5.0


class BroadcastFailed(RuntimeError):
    """A collective did not complete in time or failed (a receiver died or never joined); the group is
    unusable and must be re-formed."""


@dataclass(frozen=True, slots=True)
class GroupAddress:
    host: str
    port: int
    generation: int
    world_size: int


def group_uri(addr: GroupAddress, version: int) -> str:
    """The `WeightVersion.uri` of a broadcast publication."""
    return f"{SCHEME}://{addr.host}:{addr.port}/{addr.generation}/{addr.world_size}?version={version}"


def parse_group_uri(uri: str) -> tuple[GroupAddress, int]:
    """`group_uri`'s inverse; `ValueError` on anything else."""
    u = urlparse(uri)
    parts = u.path.strip("/").split("/")
    if u.scheme != SCHEME or not u.hostname or u.port is None or len(parts) != 2 or not u.query.startswith("version="):
        raise ValueError(f"not a broadcast weight URI: {uri!r}")
    try:
        gen, world, version = int(parts[0]), int(parts[1]), int(u.query.removeprefix("version="))
    except ValueError as exc:
        raise ValueError(f"not a broadcast weight URI: {uri!r}") from exc
    if gen < 0 or world < 2 or version < 0:
        raise ValueError(f"not a broadcast weight URI: {uri!r}")
    return GroupAddress(u.hostname, u.port, gen, world), version


def broadcast_tensor(pg: Any, tensor: Any) -> None:
    """Broadcast `tensor` from rank 0 of `pg` and wait for it (`BroadcastFailed` on any failure)."""
    _wait(_post(pg, tensor))


def _post(pg: Any, tensor: Any) -> Any:
    """Start a broadcast from rank 0 of `tensor`; the returned work is `_wait`ed on (gloo and NCCL move it
    on their own threads/streams meanwhile)."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    try:
        return pg.broadcast([tensor], opts)
    except RuntimeError as exc:
        raise BroadcastFailed(f"broadcast failed: {exc}") from exc


def _wait(work: Any) -> None:
    try:
        work.wait()
    except RuntimeError as exc:
        raise BroadcastFailed(f"broadcast failed: {exc}") from exc


def min_of(pg: Any, value: int, device: Any) -> int:
    """The smallest of every rank's `value` (an all-reduce, timed out like every collective)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MIN)
    try:
        work = pg.allreduce([t], opts)
    except RuntimeError as exc:
        raise BroadcastFailed(f"all-reduce failed: {exc}") from exc
    _wait(work)
    return int(t.item())


def broadcast_bytes(pg: Any, data: bytes | None, device: Any) -> bytes:
    """Broadcast `data` (rank 0; None on the receivers) as its length then its bytes; returns the bytes."""
    import torch

    n = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=device)
    broadcast_tensor(pg, n)
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data is not None
           else torch.empty(int(n.item()), dtype=torch.uint8, device=device))
    broadcast_tensor(pg, buf)
    return bytes(buf.cpu().numpy())


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host:port` only (port 0: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def _store(host: str, port: int, timeout_s: float, *, is_master: bool) -> Any:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s + _STORE_TIMEOUT_PAD_S)
    if not is_master:
        return dist.TCPStore(host, port, None, False, timeout=timeout, wait_for_workers=False, use_libuv=True)
    sock = listening_socket(host, port)  # torch's own would listen on every interface
    bound = sock.getsockname()[1]
    return dist.TCPStore(host, bound, None, True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=sock.detach(), use_libuv=True)


def _group(store: Any, addr: GroupAddress, rank: int, world: int, backend: str, timeout_s: float) -> Any:
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"searchr1/weights/{addr.generation}/pg", store)
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        if backend == "gloo":
            return dist.ProcessGroupGloo(prefixed, rank, world, timeout)
        if backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            return dist.ProcessGroupNCCL(prefixed, rank, world, opts)
    except (RuntimeError, dist.DistError) as exc:
        raise BroadcastFailed(f"forming the weight group {addr} failed: {exc}") from exc
    raise ValueError(f"unknown backend {backend!r} (gloo or nccl)")


@dataclass(frozen=True, slots=True)
class WireDelta:
    """A version's delta form for the wire: the delta file's bytes (`delta.py`'s encoding, the same a
    snapshot delta's file holds) against version `base`."""

    base: int
    data: bytes


class Broadcaster:
    """Rank 0: serves the store, forms each generation from the receivers that joined it
    (`rendezvous.py`), sends each publication full or as a delta. Blocking: the learner calls it from a
    worker thread."""

    def __init__(self, host: str, port: int, world_size: int, *, backend: str, timeout_s: float = 60.0,
                 bucket_bytes: int = 64 << 20, key: bytes = b"", public_host: str | None = None,
                 join_window_s: float | None = None) -> None:
        """Serve the store on `host:port` (port 0: a free one); `public_host` is the address receivers
        dial, announced in the group URI (default: `host`). `world_size`: the learner and every configured
        receiver; the first generation waits at most `timeout_s` for them to join, every later one at
        most `join_window_s` (None: `timeout_s` too), then forms with those that joined."""
        if world_size < 2:
            raise ValueError("a weight group needs the learner and at least one receiver")
        self.host = public_host or host
        self.backend, self.timeout_s, self.bucket_bytes = backend, timeout_s, bucket_bytes
        self.join_window_s = timeout_s if join_window_s is None else min(join_window_s, timeout_s)
        self._key = key
        self.world_size = world_size
        self._store = _store(host, port, timeout_s, is_master=True)
        self.port = self._store.port
        self.generation = 0
        self.members = 0
        """Receivers in the current generation (0: none formed)."""
        self.last_form = ""
        """How the last version went out: `full` or `delta`."""
        self.last_bytes = 0
        """Bytes the last version put on the wire (header, payload and digest)."""
        self._formed_once = False
        self._waiting_seen = 0
        self._backoff = 0
        """Versions to skip before the next re-formation for waiting receivers (doubles each time one
        ends short of receivers, so a receiver that keeps missing the join window costs the window at
        ever longer intervals, not every version)."""
        self._skip = 0
        self._reforming = False
        self._pg: Any = None

    @property
    def address(self) -> GroupAddress:
        return GroupAddress(self.host, self.port, self.generation, self.world_size)

    def uri(self, version: int) -> str:
        return group_uri(self.address, version)

    def refresh(self) -> None:
        """Before a version is announced: when the current generation has fewer members than configured
        receivers and a receiver was refused since it formed (one that came back, or a new one), start
        the next generation so that receiver joins it. Blocking (a store round trip)."""
        if self._pg is None or self.members >= self.world_size - 1:
            return
        if self._skip > 0:
            self._skip -= 1
            return
        if rendezvous.someone_waits(self._store, self._waiting_seen):
            self._pg, self.members = None, 0
            self.generation += 1
            self._reforming = True

    def send(self, version: int, named: Sequence[tuple[str, Any]], *, sums: dict[str, str] | None = None,
             delta: WireDelta | None = None) -> str:
        """Broadcast `named` tensors as `version`; returns the hex digest of what was sent. Forms the
        generation first if needed (`rendezvous.close_generation`). With `delta`, every member holds its
        base (an all-reduce of the versions they hold) → the delta goes out, else the whole version.
        `sums`: each tensor's checksum, sent with a full version so receivers keep it for the next delta.
        On failure the group is dropped, the generation moves on, and `BroadcastFailed` is raised."""
        try:
            if self._pg is None:
                self._form()
            return self._send(version, named, sums, delta)
        except BroadcastFailed:
            self._pg, self.members = None, 0
            self.generation += 1
            raise

    def _form(self) -> None:
        wait = self.join_window_s if self._formed_once else self.timeout_s
        try:
            members, self._waiting_seen = rendezvous.close_generation(self._store, self.generation,
                                                                      self.world_size - 1, wait)
        except (RuntimeError, OSError) as exc:
            raise BroadcastFailed(f"closing weight group generation {self.generation} failed: {exc}") from exc
        self._formed_once = True
        if members == self.world_size - 1:
            self._backoff = 0
        elif self._reforming:  # re-formed for a waiting receiver, still short: wait longer before the next
            self._backoff = min(2 * self._backoff or 1, 64)
            self._skip = self._backoff
        self._reforming = False
        if members == 0:
            raise BroadcastFailed(f"no receiver joined weight group generation {self.generation} "
                                  f"within {wait:.1f} s")
        self._pg = _group(self._store, self.address, 0, members + 1, self.backend, self.timeout_s)
        self.members = members

    def _layout(self, version: int, named: Sequence[tuple[str, Any]]) -> tuple[dict[str, Any], list[list[int]]]:
        buckets = plan_buckets([padded(tensor_nbytes(t)) for _, t in named], self.bucket_bytes)
        specs = [{"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for n, t in named]
        return {"version": version, "buckets": [[specs[i] for i in b] for b in buckets]}, buckets

    def header_digest(self, version: int, named: Sequence[tuple[str, Any]]) -> str:
        """sha256 of the version's layout (version, names, dtypes, shapes, bucket plan): the announcement's
        digest; the header on the wire adds the form and the checksums."""
        return hashlib.sha256(json.dumps(self._layout(version, named)[0]).encode()).hexdigest()

    def _send(self, version: int, named: Sequence[tuple[str, Any]], sums: dict[str, str] | None,
              delta: WireDelta | None) -> str:
        import torch

        device = named[0][1].device if named else torch.device("cpu")
        held = min_of(self._pg, delta.base if delta is not None else -1, device)
        digest = xxhash.xxh3_128()
        if delta is not None and held == delta.base:
            header = json.dumps({"version": version, "form": "delta", "base": delta.base,
                                 "bytes": len(delta.data)}).encode()
            broadcast_bytes(self._pg, header, device)
            digest.update(delta.data)
            broadcast_tensor(self._pg, torch.frombuffer(bytearray(delta.data), dtype=torch.uint8).to(device))
            payload = len(delta.data)
        else:
            layout, buckets = self._layout(version, named)
            header = json.dumps({**layout, "form": "full", "sums": sums}).encode()
            broadcast_bytes(self._pg, header, device)
            payload = self._send_buckets(named, buckets, digest, device)
        raw = digest.digest()
        signed = raw + mac(self._key, header, raw)
        broadcast_tensor(self._pg, torch.frombuffer(bytearray(signed), dtype=torch.uint8).to(device))
        self.last_form = "delta" if delta is not None and held == delta.base else "full"
        self.last_bytes = 8 + 8 + len(header) + 8 + payload + len(signed)  # the all-reduce, lengths, bytes
        return raw.hex()

    def _send_buckets(self, named: Sequence[tuple[str, Any]], buckets: list[list[int]], digest: Any,
                      device: Any) -> int:
        import torch

        # two buffers: bucket k is packed (and hashed) while bucket k-1 is on the wire
        size = max((sum(padded(tensor_nbytes(named[i][1])) for i in b) for b in buckets), default=0)
        bufs = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(min(2, len(buckets)))]
        work, sent = None, 0
        for k, b in enumerate(buckets):
            flat = pack_bucket([named[i][1] for i in b], digest, out=bufs[k % 2])
            if work is not None:
                _wait(work)
            work = _post(self._pg, flat)
            sent += flat.numel()
        if work is not None:
            _wait(work)
        return sent

    def close(self) -> None:
        self._pg = None
        self._store = None
