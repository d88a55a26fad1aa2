"""Run one registered scorer over a batch: resolve the name, validate params (request over config over
defaults) and item shapes, then call it on the event loop (small batches of cheap scorers), in the
thread pool (CPU-heavy scorers, large batches) or as a coroutine (the judge, the composite).

Owns no state; the service and the benchmark's in-process baseline both call `run_scorer`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from searchr1.core.clients.reward import ScoreItem
from searchr1.reward.registry import (
    CompositeParams,
    Scored,
    ScorerInputError,
    ScoringContext,
    check_items,
)


async def run_scorer(ctx: ScoringContext, name: str, items: Sequence[ScoreItem],
                     params: dict[str, Any] | None = None) -> list[Scored]:
    """Scores and breakdowns of `items` under scorer `name`, in item order."""
    spec = ctx.registry.get(name)
    p = ctx.params_for(name, params)
    if isinstance(p, CompositeParams):
        validate_composite(p, ctx)
    check_items(spec, items)
    if not items:
        return []
    if spec.is_async:
        results = await spec.run(items, p, ctx)  # type: ignore[misc]
    elif ctx.executor is not None and (spec.cpu_heavy or len(items) > ctx.inline_max_items):
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(ctx.executor, spec.run, items, p, ctx)
    else:
        results = spec.run(items, p, ctx)
    results = list(results)
    if len(results) != len(items):
        raise RuntimeError(f"scorer {name!r} returned {len(results)} results for {len(items)} items")
    for value, _ in results:
        if not math.isfinite(value):
            raise ScorerInputError(f"scorer {name!r} produced a non-finite score ({value})")
    return results


def validate_composite(p: CompositeParams, ctx: ScoringContext) -> None:
    """Every component names a known, non-composite scorer with valid params."""
    for comp in p.components:
        spec = ctx.registry.get(comp.scorer)
        if spec.name == "composite":
            raise ScorerInputError("a composite component cannot itself be composite")
        ctx.params_for(comp.scorer, comp.params)
