"""The engine's reload protocol, both sides of vLLM's `collective_rpc`: a worker extension class that runs
inside vLLM's worker process (engine arg `worker_extension_cls=WORKER_EXTENSION`, vLLM's supported
extension point for RL weight updates), and the rollout process's calls into it (`reload_engine`,
`receive_broadcast`). vLLM imports the class by its dotted path inside its own worker process, so this
module stays importable on its own, with vLLM and torch imported inside the functions that run there.

Inside the engine (`WeightReceiverExtension`):

- `searchr1_weights_join(uri)`: join the group the announcement's URI names (its generation); returns
  the rank, or raises when the group is full (a late joiner catches up from a snapshot instead);
- `searchr1_weights_receive(uri)`: receive the publication the URI names, bucket by bucket, straight
  into the model's `load_weights` through the runner's in-place `reload_weights` (no file, no second
  copy of the model); returns the digest of the received tensors, checked against the learner's and
  its signature against the run's weight token (`WEIGHTS_KEY_ENV`, set by the rollout process). A
  version sent as a delta is applied to the receiver's host copy of the version before (`receiver.py`),
  every resulting tensor checked, and every tensor of the version handed to the reload. A failure
  (timeout, the sender gone) leaves the group and raises; a refused digest or delta raises too: the worker
  then loads the latest snapshot (and joins the next generation when it left this one).
- `searchr1_load_snapshot(path, digest)`: the snapshot transport's in-place reload: the snapshot read
  into memory with every chunk checked against the announced digest as it is read
  (`read.read_verified`), the model loaded from those same bytes (`safetensors.snapshot_tensors`), the
  CPU GEMMs re-packed; a snapshot refused leaves the model as it was.
- `searchr1_apply_delta(path, digest)`: a delta version's in-place reload: the delta read verified like a
  snapshot, applied to the engine's copy of the version it runs (`apply.BaseWeights`: kept from the last
  full snapshot load and updated by each delta; a delta against another version is refused before
  anything changes, and one whose resulting tensors fail their checksums is undone), then the resulting
  tensors handed to vLLM's in-place `reload_weights` and the CPU GEMMs re-packed. A refused delta leaves
  the model and the copy as they were.
- `searchr1_last_load_times()`: where the last load (snapshot, delta or broadcast) spent its time (`LoadTimes`).

The copy of the published version costs one copy of the weights in the engine worker's host memory (in
the published dtype): the one kept from the last snapshot load, or the broadcast receiver's from the last
version it received (`receiver.py`), never both — loading one drops the other. vLLM's in-place reload reloads a layer only once every tensor of it has arrived
(its layerwise reload), so each delta hands it every tensor of the version, not only the changed values:
the engine's own load costs what a full load from memory does; the read, the verification and the bytes
on the disk and the wire are the delta's.

The engine is busy while it receives (the call runs in the engine's worker), so generation pauses for
the duration of the transfer, as it does for a snapshot reload.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from searchr1.weightsync.apply import BaseWeights
from searchr1.weightsync.broadcast import WEIGHTS_KEY_ENV, parse_group_uri
from searchr1.weightsync.delta import DELTA_FILE, Delta, DeltaRefused
from searchr1.weightsync.manifest import SnapshotError
from searchr1.weightsync.read import read_verified
from searchr1.weightsync.receiver import Receiver
from searchr1.weightsync.safetensors import safetensors_metadata, snapshot_tensors

WORKER_EXTENSION = "searchr1.weightsync.vllm_ext.WeightReceiverExtension"
"""The engine arg `worker_extension_cls` that enables the searchr1 reload protocol (snapshots read
verified, broadcast receipt, the CPU reload fix)."""
TIMEOUT_ENV = "SEARCHR1_WEIGHTS_TIMEOUT_S"
"""The environment variable that sets a receiver's collective timeout inside an engine's worker (seconds;
default 60)."""


@dataclass
class LoadTimes:
    """Where a verified snapshot load spent its time (seconds)."""

    read_verify: float = 0.0
    """Reading every byte into memory with its chunk digests checked (`read_verified`)."""
    load_weights: float = 0.0
    """The engine's own load from those bytes (vLLM's `load_weights` through `reload_weights`)."""
    gemm_repack: float = 0.0
    """vLLM CPU: re-packing the GEMM of the layers that keep their weight (`refresh_cpu_gemm`)."""
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        return {"read_verify_s": self.read_verify, "load_weights_s": self.load_weights,
                "gemm_repack_s": self.gemm_repack, **self.extra}


class WeightReceiverExtension:
    """Mixed into vLLM's worker class; state lives in one attribute so it never clashes with vLLM's."""

    def _searchr1_receiver(self) -> Receiver:
        rx = getattr(self, "_searchr1_rx", None)
        if rx is None:
            # the worker's device (vLLM 0.19's CPU worker leaves `device` None; its model runner has it)
            where = getattr(self, "device", None) or self.model_runner.device  # type: ignore[attr-defined]
            device = "cpu" if where.type == "cpu" else str(where)
            rx = Receiver(backend="gloo" if device == "cpu" else "nccl",
                          timeout_s=float(os.environ.get(TIMEOUT_ENV, "60")), device=device,
                          key=os.environ.get(WEIGHTS_KEY_ENV, "").encode(),  # the run's weight token
                          keep_base=True)  # a host copy of the last version, for the deltas on the wire
            self._searchr1_rx = rx
        return rx

    def searchr1_weights_join(self, uri: str) -> int:
        addr, _ = parse_group_uri(uri)
        rx = self._searchr1_receiver()
        if rx.address == addr:
            return int(rx.rank)  # type: ignore[arg-type]
        return rx.join(addr)

    def searchr1_weights_receive(self, uri: str) -> str:
        addr, version = parse_group_uri(uri)
        rx = self._searchr1_receiver()
        if rx.address != addr:
            rx.join(addr)
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        times = {"receive_s": 0.0}
        tensors = _timed(rx.receive(version), times, "receive_s")
        t0 = time.perf_counter()
        self._searchr1_base: BaseWeights | None = None  # the copy of a published version no longer matches
        runner.reload_weights(weights_iterator=tensors)
        for _ in tensors:  # a model that stops early still receives the rest and the digest
            pass
        times["load_weights_s"] = time.perf_counter() - t0 - times["receive_s"]
        self._searchr1_times = times
        return str(rx.last_digest)

    def searchr1_load_snapshot(self, path: str, digest: str) -> dict[str, Any]:
        """Reload the model in place from the snapshot at `path`, verified against the announced `digest`
        as it is read, then re-pack the CPU GEMMs. Returns the phase seconds (`LoadTimes.as_dict`), or
        {"error": why} when the snapshot is refused: nothing was loaded then."""
        times = LoadTimes()
        try:
            t0 = time.perf_counter()
            files = read_verified(path, digest)
            times.read_verify = time.perf_counter() - t0
            tensors = list(snapshot_tensors(files))  # views, parsed before anything is loaded
        except (SnapshotError, OSError) as exc:
            return {"error": str(exc)}
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        self._searchr1_base = None
        t0 = time.perf_counter()
        runner.reload_weights(weights_iterator=iter(tensors))
        times.load_weights = time.perf_counter() - t0
        t0 = time.perf_counter()
        refresh_cpu_gemm(runner.get_model())
        times.gemm_repack = time.perf_counter() - t0
        # the verified bytes stay as the engine's copy of this version, for the deltas that follow; a
        # broadcast receiver's copy is of other weights now (one copy held at a time)
        self._searchr1_base = base_of(files, tensors)
        rx = getattr(self, "_searchr1_rx", None)
        if rx is not None:
            rx.drop_base()
        self._searchr1_times = times.as_dict()
        return self._searchr1_times

    def searchr1_apply_delta(self, path: str, digest: str) -> dict[str, Any]:
        """Apply the delta at `path` (verified against the announced `digest` as it is read) to the
        engine's copy of the version it runs, check every resulting tensor against its published checksum,
        and reload the model in place from the result; returns the phase seconds, or {"error": why} when
        the delta is refused (out of order, unverifiable): nothing changed then."""
        times = LoadTimes()
        base: BaseWeights | None = getattr(self, "_searchr1_base", None)
        try:
            if base is None:
                raise DeltaRefused("the engine holds no verified copy of a published version to apply a delta to")
            t0 = time.perf_counter()
            files = read_verified(path, digest)
            if DELTA_FILE not in files:
                raise DeltaRefused(f"{path}: no {DELTA_FILE}")
            delta = Delta.parse(files[DELTA_FILE])
            times.read_verify = time.perf_counter() - t0
            t0 = time.perf_counter()
            changed = base.apply(delta)
            times.extra["apply_verify_s"] = time.perf_counter() - t0
        except (SnapshotError, OSError) as exc:
            return {"error": str(exc)}
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        runner.reload_weights(weights_iterator=iter(list(base.tensors.items())))
        times.load_weights = time.perf_counter() - t0
        t0 = time.perf_counter()
        refresh_cpu_gemm(runner.get_model())
        times.gemm_repack = time.perf_counter() - t0
        times.extra["changed_tensors"] = float(len(changed))
        self._searchr1_times = times.as_dict()
        return self._searchr1_times

    def searchr1_base_version(self) -> int | None:
        """The version of the engine's copy of the published weights (None: it holds none)."""
        base = getattr(self, "_searchr1_base", None)
        return None if base is None else base.version

    def searchr1_refresh_cpu_gemm(self) -> int:
        """After an in-place reload on CPU: rebuild the packed GEMM of the layers that keep their weight
        (see `refresh_cpu_gemm`); returns how many were rebuilt."""
        t0 = time.perf_counter()
        n = refresh_cpu_gemm(self.model_runner.get_model())  # type: ignore[attr-defined]
        getattr(self, "_searchr1_times", {})["gemm_repack_s"] = time.perf_counter() - t0
        return n

    def searchr1_last_load_times(self) -> dict[str, float]:
        """The phase seconds of the last load: a snapshot's (`searchr1_load_snapshot`) or a broadcast's
        (`receive_s`: on the wire, the digest and unpacking; `load_weights_s`: vLLM's own load;
        `gemm_repack_s`)."""
        return dict(getattr(self, "_searchr1_times", {}))

    def searchr1_weights_generation(self) -> int | None:
        rx = getattr(self, "_searchr1_rx", None)
        return None if rx is None or rx.address is None else rx.address.generation


def base_of(files: dict[str, memoryview], tensors: list[tuple[str, Any]]) -> BaseWeights:
    """The copy of a full snapshot's version a delta applies to: its tensors (views over the verified
    bytes, kept), the version and checksums its publisher wrote into the metadata (version −1 when it
    has none: a snapshot written by another tool, to which no delta applies)."""
    import json

    meta: dict[str, str] = {}
    for name in sorted(files):
        if name.endswith(".safetensors"):
            meta.update(safetensors_metadata(files[name]))
    try:
        version = int(meta.get("searchr1_version", "-1"))
        sums = json.loads(meta["searchr1_checksums"]) if "searchr1_checksums" in meta else None
    except ValueError:
        version, sums = -1, None
    return BaseWeights.of(tensors, version, sums)


def _timed(items: Iterable[Any], times: dict[str, float], key: str) -> Iterator[Any]:
    """`items`, with the seconds spent producing them added to `times[key]`."""
    it = iter(items)
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            times[key] += time.perf_counter() - t0
            return
        times[key] += time.perf_counter() - t0
        yield item


def refresh_cpu_gemm(model: Any) -> int:
    """vLLM's CPU build runs each linear layer through a GEMM packed from its weight at load time
    (`dispatch_cpu_unquantized_gemm`). Its in-place `reload_weights` re-packs the layers whose weight it
    removes (qkv, o, gate/up, down projections), but not those that keep it (`remove_weight=False`: the
    LM head): those go on computing with the weights the engine started with (measured on vLLM 0.32 CPU,
    the tiny test model: the LM head's output up to 8.2 off on a random input, greedy tokens and log-probs
    matching neither version). Re-pack every layer that still holds a 2-D weight.
    Returns the number of layers re-packed; 0 off CPU."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    n = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.ndim == 2 and weight.numel():
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            n += 1
    return n


async def receive_broadcast(generator: Any, uri: str) -> str:
    """Receive the publication `uri` names into a `VllmGenerator`'s engine (started with
    `worker_extension_cls=WORKER_EXTENSION`), then drop the prefix cache (its KV came from the old
    weights). Returns the digest of the received tensors (equal to the sender's, or this raised)."""
    digests = await generator.engine.collective_rpc("searchr1_weights_receive", kwargs={"uri": uri})
    await generator.engine.collective_rpc("searchr1_refresh_cpu_gemm")
    await generator.engine.reset_prefix_cache()
    return str(digests[0])


async def apply_engine_delta(engine: Any, path: str, digest: str) -> dict[str, float]:
    """Apply the delta version at `path` to vLLM `engine` (started with `WORKER_EXTENSION`) in place;
    returns the phase seconds. A refused delta raises `DeltaRefused` with the weights unchanged. The caller
    resets the prefix cache afterwards."""
    results = await engine.collective_rpc("searchr1_apply_delta", kwargs={"path": path, "digest": digest})
    refused = next((r["error"] for r in results if "error" in r), None)
    if refused is not None:
        raise DeltaRefused(refused)
    return dict(results[0])


async def reload_engine(engine: Any, weights_path: str, digest: str | None, *, extension: bool) -> dict[str, float]:
    """Swap the weights of vLLM `engine` in place from the snapshot at `weights_path`; returns the phase
    seconds. With the announced `digest` and the extension, the engine reads the snapshot verified as it
    reads it and loads those bytes (`searchr1_load_snapshot`); without the extension they are verified
    here and vLLM reads the files again. A refused snapshot raises `SnapshotError` with the weights
    unchanged. The caller resets the prefix cache afterwards (its KV came from the old weights)."""
    if digest is not None and extension:
        results = await engine.collective_rpc("searchr1_load_snapshot", kwargs={"path": weights_path, "digest": digest})
        refused = next((r["error"] for r in results if "error" in r), None)
        if refused is not None:
            raise SnapshotError(refused)
        return dict(results[0])
    if digest is not None:  # no searchr1 extension in the engine: verify here, vLLM reads again
        await asyncio.to_thread(read_verified, weights_path, digest)
    await engine.collective_rpc("reload_weights", kwargs={"weights_path": weights_path})
    if extension:  # vLLM CPU: the LM head's packed GEMM is not rebuilt by the reload
        await engine.collective_rpc("searchr1_refresh_cpu_gemm")
    return {}
