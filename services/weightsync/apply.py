"""The worker's copy of the version it runs (`BaseWeights`), and applying a delta to it: refused before
anything is touched when it was made against another version, patched in place (tensors patched and hashed
on a thread pool), every resulting tensor checked against the publisher's checksum, and every value put
back on any mismatch (`delta.py` has the encoding; docs/architecture.md, "Weight sync")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from searchr1.weightsync.delta import Delta, DeltaRefused, Patch, as_bits, checksum, checksums


@dataclass
class BaseWeights:
    """The published tensors of the version a worker runs (host copies, writable), with their checksums."""

    tensors: dict[str, Any]
    version: int
    sums: dict[str, str] = field(default_factory=dict)
    """Each tensor's checksum (xxh3-64), as listed by the publisher for this version."""

    @classmethod
    def of(cls, tensors: Iterable[tuple[str, Any]], version: int, sums: Mapping[str, str] | None = None) -> BaseWeights:
        """A copy for `version` over `tensors` (kept, not copied: they must be writable and owned by the
        caller); checksums computed when not given."""
        named = dict(tensors)
        return cls(named, version, dict(sums) if sums is not None else checksums(named))

    def apply(self, delta: Delta, threads: int | None = None) -> list[str]:
        """Apply `delta` in place, verified; returns the names of the tensors it changed. Refuses
        (`DeltaRefused`, the tensors unchanged) a delta against another version, one whose tensors differ
        from these in name, dtype or shape, or whose resulting tensors fail their checksums. Blocking.
        `threads`: tensors patched and hashed at once (numpy's gather and scatter and xxhash release the
        GIL; default `default_threads()`): the wall time shrinks with the cores, the CPU time does not."""
        h = delta.header
        if h.base != self.version:
            raise DeltaRefused(f"delta {h.base}→{h.version} does not apply to version {self.version} (out of order)")
        if h.tensors.keys() != self.tensors.keys():
            raise DeltaRefused(f"delta {h.base}→{h.version} lists other tensors than version {self.version} holds")
        for name, spec in h.tensors.items():
            t = self.tensors[name]
            if str(t.dtype).removeprefix("torch.") != spec["dtype"] or list(t.shape) != list(spec["shape"]):
                raise DeltaRefused(f"{name}: {spec['dtype']} {spec['shape']} in the delta, {t.dtype} "
                                   f"{list(t.shape)} held")
            if "count" not in spec and spec["checksum"] != self.sums.get(name):
                raise DeltaRefused(f"{name}: unchanged by delta {h.base}→{h.version}, but its checksum differs "
                                   f"from the one held (another base)")
        undo: list[tuple[Any, Any, Any]] = []
        changed: list[str] = []
        error: BaseException | None = None
        n = default_threads() if threads is None else max(1, threads)
        with ThreadPoolExecutor(n) as pool:
            futures = []
            try:
                for patch in delta.patches(self.tensors):  # decoded here while the pool patches the ones before
                    futures.append(pool.submit(self._patch, patch) if n > 1 else _done(self._patch, patch))
            except BaseException as exc:  # noqa: BLE001 - undone below, then raised
                error = exc
            for fut in futures:  # every submitted patch is waited for: what was written must be undone
                try:
                    name, flat, pos, old, got = fut.result()
                except BaseException as exc:  # noqa: BLE001 - undone below, then raised
                    error = error or exc
                    continue
                undo.append((flat, pos, old))
                if got != h.tensors[name]["checksum"]:
                    error = error or DeltaRefused(f"{name}: checksum {got} after delta {h.base}→{h.version}, "
                                                  f"{h.tensors[name]['checksum']} published")
                changed.append(name)
        if error is not None:
            for flat, pos, old in reversed(undo):
                flat[pos] = old
            raise error
        self.version = h.version
        self.sums = {name: spec["checksum"] for name, spec in h.tensors.items()}
        return changed

    def _patch(self, patch: Patch) -> tuple[str, Any, Any, Any, str]:
        """Write one patch (as bits, in place); returns what undoes it and the resulting checksum."""
        import numpy as np

        flat = as_bits(self.tensors[patch.name]).numpy()  # a view: written in place, as bits
        pos = patch.positions.numpy()
        old = np.take(flat, pos)  # a third less CPU than `flat[pos]` for sorted positions; a few ns a value
        flat[pos] = as_bits(patch.values).numpy()
        return patch.name, flat, pos, old, checksum(self.tensors[patch.name])


def default_threads() -> int:
    """Threads a worker patches and hashes with: the cores it may use, at most 8."""
    import os

    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def _done(fn: Any, arg: Any) -> Future:
    """`fn(arg)` run here, as a completed future (one thread: no pool hop)."""
    fut: Future = Future()
    try:
        fut.set_result(fn(arg))
    except BaseException as exc:  # noqa: BLE001 - delivered through the future
        fut.set_exception(exc)
    return fut
