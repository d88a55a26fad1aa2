"""Interruptible (partial) rollouts: swap weights without waiting for in-flight trajectories.

Without it (`[rollout.weights] partial_rollouts = false`, the default and Search-R1's regime), a worker
that sees a newer weight version stops taking tasks, lets every in-flight group finish under the old
weights, then reloads (`worker.py`): on a long-tailed workload the engine runs a few long trajectories
on mostly empty slots while it waits.

With it, `InterruptibleGenerator` wraps the engine and the swap goes:

    set the interrupt → every running turn stops at its next token (vLLM aborts the request) and returns
    the tokens and log-probs it has → new turns wait → weights load → each interrupted turn resumes from
    its prefix (prompt + everything so far) with the rest of its token budget, under the new version.

Every sampled token is tagged with the version that sampled it (`TurnOutput.versions`); the agent folds
the tags into `Trajectory.segments` (`core/segments.py`), the learner measures a group's staleness by its
oldest segment and weighs each token by its own behaviour log-prob. A group's `policy_version` is its
oldest segment's version.

A resumed turn is a new engine request (id suffixed `-r1`, `-r2`, …; a seeded turn gets a seed per
resume, so it does not replay the interrupted part's random stream). Stop strings are checked by the
engine within one request, so a stop string cut exactly at the seam (`</sea` | `rch>`) is not seen as
one and the turn runs on to its next stop, EOS or budget; the agent parses the whole turn's text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from searchr1.rollout.engine import Generator, TurnOutput, TurnRequest
from searchr1.weightsync import DeltaRefused

RESUME_SEED_STRIDE = 104_729
"""Added to a seeded turn's seed per resume."""


class InterruptibleGenerator:
    """A `Generator` whose turns a weight swap interrupts and resumes (see the module docstring)."""

    def __init__(self, inner: Generator, version: int, on_interrupt: Callable[[], Any] | None = None) -> None:
        self.inner = inner
        self.on_interrupt = on_interrupt
        """Called once per interrupted turn (the worker counts them in its metrics)."""
        self.version = version
        """The weight version the engine runs; new turns and resumed ones are tagged with it."""
        self.interruptions = 0
        """Turns interrupted by swaps so far."""
        self.swaps = 0
        self._interrupt = asyncio.Event()
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._active = 0

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        """One turn; interrupted by a swap, it resumes under the new weights until it ends on its own."""
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        text = ""
        part = 0
        while True:
            await self._open.wait()
            version = self.version
            out = await self._run(_resumed(request, ids, part, self._interrupt),
                                  request_id if part == 0 else f"{request_id}-r{part}")
            ids += out.token_ids
            logprobs += out.logprobs
            versions += [version] * len(out.token_ids)
            text += out.text
            if out.finish != "interrupted":
                return TurnOutput(ids, logprobs, text, out.finish, out.stop_reason, versions)
            self.interruptions += 1
            if self.on_interrupt is not None:
                self.on_interrupt()
            if len(ids) >= request.max_tokens:
                return TurnOutput(ids, logprobs, text, "length", None, versions)
            part += 1

    async def _run(self, request: TurnRequest, request_id: str) -> TurnOutput:
        self._active += 1
        self._idle.clear()
        try:
            return await self.inner.generate(request, request_id)
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def swap(self, load: Callable[[], Awaitable[Any]], version: Callable[[], int]) -> Any:
        """Interrupt every running turn, hold new ones, run `load` (which reloads the engine), take
        `version()` as the engine's version, and resume; returns what `load` returned."""
        self._open.clear()
        self._interrupt.set()
        try:
            await self._idle.wait()
            result = await load()
            self.version = version()
            self.swaps += 1
            return result
        finally:
            self._interrupt.clear()
            self._open.set()

    async def reload(self, weights_path: str, digest: str | None = None) -> None:
        await self.inner.reload(weights_path, digest)

    async def apply_delta(self, delta_path: str, digest: str) -> None:
        apply = getattr(self.inner, "apply_delta", None)
        if apply is None:
            raise DeltaRefused("the engine applies no deltas: it loads full versions only")
        await apply(delta_path, digest)

    async def close(self) -> None:
        await self.inner.close()

    def tokenizer(self) -> Any:
        return self.inner.tokenizer()  # type: ignore[attr-defined]


def _resumed(request: TurnRequest, sampled: list[int], part: int, interrupt: asyncio.Event) -> TurnRequest:
    """The request that continues `request` after `sampled` tokens (part 0: the request itself)."""
    if part == 0:
        return replace(request, interrupt=interrupt)
    seed = None if request.seed is None else request.seed + RESUME_SEED_STRIDE * part
    return replace(request, prompt_ids=[*request.prompt_ids, *sampled], max_tokens=request.max_tokens - len(sampled),
                   seed=seed, interrupt=interrupt)
