"""The receiving end of the `broadcast` weight transport, inside vLLM: a worker extension class (engine
arg `worker_extension_cls="searchr1.rollout.broadcast_ext.BroadcastWeightReceiver"`), whose methods the
rollout process calls with `collective_rpc` (vLLM's supported extension point for RL weight updates).

- `searchr1_weights_join(uri)`: join the group the announcement's URI names (its generation); returns
  the rank, or raises when the group is full (a late joiner catches up from a snapshot instead);
- `searchr1_weights_receive(uri)`: receive the publication the URI names, bucket by bucket, straight
  into the model's `load_weights` through the runner's in-place `reload_weights` (no file, no second
  copy of the model); returns the digest of the received tensors, checked against the learner's and
  its signature against the run's weight token (`SEARCHR1_WEIGHTS_KEY`, set by the rollout process). A
  failure (timeout, the sender gone, a digest mismatch) leaves the group and raises: the worker then
  loads the latest snapshot, and joins the next generation when one is announced.

- `searchr1_load_snapshot(path, digest)`: the snapshot transport's in-place reload: the snapshot read
  into memory with every chunk checked against the announced digest as it is read
  (`core.snapshot_read.read_verified`), the model loaded from those same bytes (`snapshot_load.py`), the
  CPU GEMMs re-packed; a snapshot refused leaves the model as it was.
- `searchr1_last_load_times()`: where the last load (snapshot or broadcast) spent its time.

The engine is busy while it receives (the call runs in the engine's worker), so generation pauses for
the duration of the transfer, as it does for a snapshot reload.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from searchr1.core.broadcast import WEIGHTS_KEY_ENV, Receiver, parse_group_uri
from searchr1.core.snapshot_manifest import SnapshotError


class BroadcastWeightReceiver:
    """Mixed into vLLM's worker class; state lives in one attribute so it never clashes with vLLM's."""

    def _searchr1_receiver(self) -> Receiver:
        rx = getattr(self, "_searchr1_rx", None)
        if rx is None:
            import os

            # the worker's device (vLLM 0.19's CPU worker leaves `device` None; its model runner has it)
            where = getattr(self, "device", None) or self.model_runner.device  # type: ignore[attr-defined]
            device = "cpu" if where.type == "cpu" else str(where)
            rx = Receiver(backend="gloo" if device == "cpu" else "nccl",
                          timeout_s=float(os.environ.get("SEARCHR1_WEIGHTS_TIMEOUT_S", "60")), device=device,
                          key=os.environ.get(WEIGHTS_KEY_ENV, "").encode())  # the run's weight token
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
        from searchr1.rollout.snapshot_load import LoadTimes, read_timed, snapshot_tensors

        times = LoadTimes()
        try:
            files = read_timed(path, digest, times)
            tensors = list(snapshot_tensors(files))  # views, parsed before anything is loaded
        except (SnapshotError, OSError) as exc:
            return {"error": str(exc)}
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        runner.reload_weights(weights_iterator=iter(tensors))
        times.load_weights = time.perf_counter() - t0
        del files, tensors
        t0 = time.perf_counter()
        refresh_cpu_gemm(runner.get_model())
        times.gemm_repack = time.perf_counter() - t0
        self._searchr1_times = times.as_dict()
        return self._searchr1_times

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


WORKER_EXTENSION = "searchr1.rollout.broadcast_ext.BroadcastWeightReceiver"
"""The engine arg `worker_extension_cls` that enables broadcast weight updates."""


async def receive_broadcast(generator: Any, uri: str) -> str:
    """Receive the publication `uri` names into a `VllmGenerator`'s engine (started with
    `worker_extension_cls=WORKER_EXTENSION`), then drop the prefix cache (its KV came from the old
    weights). Returns the digest of the received tensors (equal to the sender's, or this raised)."""
    digests = await generator.engine.collective_rpc("searchr1_weights_receive", kwargs={"uri": uri})
    await generator.engine.collective_rpc("searchr1_refresh_cpu_gemm")
    await generator.engine.reset_prefix_cache()
    return str(digests[0])
