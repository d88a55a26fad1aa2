"""The learner's chain of published versions: which versions go out full and which as a delta against
the one before (docs/architecture.md, "Weight sync"; the encoding is `delta.py`'s).

`VersionChain` keeps the previous published version's tensors (one copy, host memory, the published
dtype) and plans each new version (`plan`):

- full, no delta: the first version this process publishes (nothing to compare with: a start, a
  restart), a version that does not follow the previous one, and a version whose names, shapes or dtypes
  changed;
- full, no delta, too: a delta larger than `max_share` of the full version's bytes (the size bound: an
  fp32 publication, where nearly every value changes, goes out full);
- full *and* delta: every `full_every`-th version (the chain bound: a worker that is new or more than one
  version behind starts from the newest full and applies at most `full_every` − 1 deltas), with the delta
  still written so a worker one version behind applies it instead of the full;
- otherwise a delta only.

Every plan carries the figures of the version (`figures`): the share of published values whose bits
changed — the delta's density and the `published_changed_frac` metric, one figure — the values, and the
bytes each form takes. Blocking (a pass over both versions, and the encoding): run it in a thread.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from searchr1.weightsync.delta import checksums, diff, encode_patches
from searchr1.weightsync.settings import DeltaSettings


@dataclass
class Plan:
    """How one version is published."""

    version: int
    full: bool
    """Write a full snapshot of the version."""
    delta: dict[str, Any] | None = None
    """The delta file's tensors (against `version − 1`), or None."""
    delta_metadata: dict[str, str] = field(default_factory=dict)
    sums: dict[str, str] = field(default_factory=dict)
    """Every tensor's checksum (xxh3-64), written with either form."""
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def base(self) -> int | None:
        """The version the delta applies to (None: no delta)."""
        return self.version - 1 if self.delta is not None else None


def nbytes(state: Mapping[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


@dataclass
class VersionChain:
    """Plans each published version against the previous one (see the module docstring)."""

    settings: DeltaSettings = field(default_factory=DeltaSettings)
    """`[learner.weights.delta]`; `enabled = False`: every version full (the figures are still computed)."""
    previous: dict[str, Any] | None = field(default=None, repr=False)
    previous_version: int | None = None

    def plan(self, version: int, state: Mapping[str, Any]) -> Plan:
        """The plan for `version` with tensors `state` (kept as the previous version afterwards: not
        copied, so the caller must not change them)."""
        t0 = time.perf_counter()
        previous, prev_version = self.previous, self.previous_version
        self.previous, self.previous_version = dict(state), version
        sums = checksums(state)
        full_bytes = nbytes(state)
        plan = Plan(version, full=True, sums=sums,
                    figures={"published_values": float(sum(t.numel() for t in state.values())),
                             "published_full_bytes": float(full_bytes)})
        if previous is None or prev_version != version - 1:
            plan.figures["published_delta"] = 0.0
            return self._done(plan, t0, full_bytes)
        d = diff(previous, state)
        if d is None:
            plan.figures["published_delta"] = 0.0
            return self._done(plan, t0, full_bytes)
        plan.figures["published_changed_frac"] = d.density
        s = self.settings
        if s.enabled:
            tensors, meta = encode_patches(d, state, base=prev_version, version=version, codec=s.codec, sums=sums)
            delta_bytes = sum(t.numel() for t in tensors.values())
            plan.figures["published_delta_bytes"] = float(delta_bytes)
            if delta_bytes <= s.max_share * full_bytes:
                plan.delta, plan.delta_metadata = tensors, meta
                plan.full = version % s.full_every == 0
        plan.figures["published_delta"] = 1.0 if plan.delta is not None else 0.0
        return self._done(plan, t0, full_bytes)

    def _done(self, plan: Plan, t0: float, full_bytes: int) -> Plan:
        written = (full_bytes if plan.full else 0) + int(plan.figures.get("published_delta_bytes", 0)
                                                          if plan.delta is not None else 0)
        plan.figures["published_bytes"] = float(written)
        plan.figures["publish_plan_seconds"] = time.perf_counter() - t0
        return plan

    def forget(self) -> None:
        """Drop the previous version: the next is published full (after a publication that failed)."""
        self.previous, self.previous_version = None, None
