"""A generation engine as a processor-sharing server: what one vLLM worker does with the sequences it
decodes at once. Pure (no clock of its own: the event loop hands it the time).

vLLM decodes in iterations: each iteration every running sequence gets one token, and an iteration over
n sequences takes `iteration_s(n)`. So while n stays the same, every sequence advances at 1/iteration_s(n)
tokens per second. The engine keeps a virtual token clock V (the tokens each running sequence has
received since the engine started) and each sequence's finish mark V₀ + tokens; between events V grows
linearly, so the next finish is found without touching every sequence (a heap of finish marks). A turn's
prompt (the observation and context not yet in the KV cache) is prefilled before it decodes: prefill
takes `prefill_s_per_token` per token of the whole engine, during which no sequence decodes (a stall).
At most `max_seqs` sequences decode at once; the rest wait in order (vLLM's waiting queue).

Two shapes of `iteration_s`: a GPU's, a + b·n (a: reading the weights once per iteration; b: each
sequence's KV cache and arithmetic, `searchr1.simulator.gpu`), and a CPU's, b·n (compute-bound: the
engine's total tokens per second is the same however many sequences share it), calibrated from a run's
stage clocks (`searchr1.simulator.calibrate`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

EPS = 1e-9


@dataclass(frozen=True)
class Linear:
    """`iteration_s(n) = base_s + per_seq_s · n`."""

    base_s: float
    per_seq_s: float

    def __call__(self, n: int) -> float:
        return self.base_s + self.per_seq_s * n


@dataclass
class Engine:
    iteration_s: Callable[[int], float]
    """Seconds of one decode iteration over n running sequences."""
    prefill_s_per_token: float = 0.0
    """Seconds of the whole engine per prefilled token."""
    max_seqs: int = 256
    """Sequences decoding at once (vLLM's `max_num_seqs`)."""
    t: float = 0.0
    """Time of the last update."""
    v: float = 0.0
    """Virtual tokens: what each running sequence has received since the start."""
    stall_until: float = 0.0
    """Decoding is paused (prefill) until then."""
    busy_s: float = 0.0
    """Seconds with a sequence running or a prefill in progress (the `generation` stage)."""
    tokens: float = 0.0
    """Tokens decoded."""
    _running: list[tuple[float, int]] = field(default_factory=list)
    _waiting: deque[tuple[int, float, int]] = field(default_factory=deque)
    _marks: dict[int, float] = field(default_factory=dict)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    def advance(self, now: float) -> None:
        """Bring the engine's clocks to `now` (no sequence finishes in between: the caller's events say)."""
        if now < self.t - EPS:
            raise ValueError(f"time runs backwards: {now} < {self.t}")
        now = max(now, self.t)
        n = len(self._running)
        stalled = max(0.0, min(now, self.stall_until) - self.t)
        decoding = max(0.0, now - max(self.t, self.stall_until))
        if n:
            self.v += decoding / self.iteration_s(n)
            self.tokens += n * decoding / self.iteration_s(n)
            self.busy_s += now - self.t
        else:
            self.busy_s += stalled
        self.t = now

    def add(self, now: float, seq: int, tokens: int, prefill_tokens: int = 0) -> None:
        """Sequence `seq` arrives at `now` to prefill `prefill_tokens` and decode `tokens`."""
        self.advance(now)
        self.stall_until = max(self.stall_until, now) + prefill_tokens * self.prefill_s_per_token
        self._waiting.append((seq, float(tokens), prefill_tokens))
        self._admit()

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_seqs:
            seq, tokens, _ = self._waiting.popleft()
            mark = self.v + tokens
            self._marks[seq] = mark
            heapq.heappush(self._running, (mark, seq))

    def next_finish(self) -> float:
        """When the next running sequence finishes (inf when none runs)."""
        if not self._running:
            return float("inf")
        left = max(0.0, self._running[0][0] - self.v)
        return max(self.t, self.stall_until) + left * self.iteration_s(len(self._running))

    def pop_finished(self, now: float) -> list[int]:
        """Advance to `now` and take the sequences that have finished by then (admitting waiting ones)."""
        self.advance(now)
        done = []
        while self._running and self._running[0][0] <= self.v + EPS:
            _, seq = heapq.heappop(self._running)
            self._marks.pop(seq, None)
            done.append(seq)
        self._admit()
        return done
