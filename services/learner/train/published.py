"""What reaches the engine: per published version, the share of its values whose bits differ from the
previous version's — the figure that says the optimizer's updates survive the cast to the published dtype.

With fp32 master weights and a bf16 engine, an update moves the published value only where the master's
accumulated movement crosses a bf16 rounding boundary: at lr 1e-6 a few percent of the values per step
(docs/learner.md, "Precision"). A share that stays at 0 while the loss moves means the updates are not
reaching the engine (the `PublishedValuesFrozen` alert). The comparison is bitwise (what a delta of the two
versions would carry), so +0/−0 and NaN payloads count as they are stored.

Owns the comparison and the previous version it is made against (one published copy in host memory on the
rank that publishes); not the publishing itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def changed_elements(previous: Tensor | None, current: Tensor) -> int:
    """How many elements of `current` differ bitwise from `previous` (all of them when there is no
    previous tensor, or it has another shape or dtype)."""
    if previous is None or previous.shape != current.shape or previous.dtype != current.dtype:
        return current.numel()
    as_bits = _BITS[current.element_size()]
    a, b = previous.contiguous(), current.contiguous()
    if a.dtype != torch.bool:
        a, b = a.view(as_bits), b.view(as_bits)
    return int((a != b).sum())


@dataclass
class PublishedChange:
    """Compares each published state dict with the one before it."""

    previous: dict[str, Tensor] | None = field(default=None, repr=False)

    def observe(self, state: dict[str, Tensor]) -> dict[str, float]:
        """The figures of `state` against the previous version (`published_changed_frac`: share of values
        changed; `published_values`: their number), then `state` becomes the previous version. The first
        call has nothing to compare with and returns {}. Blocking (a pass over every value): run it in a
        thread."""
        previous, self.previous = self.previous, state
        if previous is None:
            return {}
        total = sum(t.numel() for t in state.values())
        changed = sum(changed_elements(previous.get(k), t) for k, t in state.items())
        return {"published_changed_frac": changed / max(total, 1), "published_values": float(total)}
