"""The restart rule of a supervised process: whether a death is restarted, how long to wait first, and when
a process has crashed too often to go on (Kubernetes' `restartPolicy: OnFailure` with its crash-loop
back-off, for the processes of one machine).

Pure: the supervisor owns the clock and the processes; this module only answers from the deaths it is
told about. The wait before restart n within the window is `initial · 2^(n-1)`, capped at `max`, plus a
uniform jitter in `[0, jitter]` (the policy of `searchr1.core.retry`'s clients, here over a restart history
rather than an attempt loop, which is why tenacity's wait objects are not used directly).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from searchr1.launcher.settings import RestartSettings


def backoff_s(attempt: int, initial_s: float, max_s: float, jitter_s: float, rng: random.Random) -> float:
    """The wait before restart `attempt` (1, 2, …): `initial_s · 2^(attempt-1)` capped at `max_s`, plus
    uniform jitter in `[0, jitter_s]`."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    base = min(max_s, initial_s * 2.0 ** min(attempt - 1, 60))
    return base + (rng.uniform(0.0, jitter_s) if jitter_s > 0 else 0.0)


@dataclass
class RestartRule:
    """One process's rule and its history of restarts (monotonic times)."""

    max_restarts: int
    window_s: float
    backoff_initial_s: float
    backoff_max_s: float
    jitter_s: float
    rng: random.Random = field(default_factory=random.Random)
    restarts: deque[float] = field(default_factory=deque)
    """When each restart within the window was decided."""
    total: int = 0
    """Restarts over the whole run."""

    @classmethod
    def from_settings(cls, s: RestartSettings, seed: int | None = None) -> RestartRule:
        return cls(s.max_restarts, s.window_s, s.backoff_initial_s, s.backoff_max_s, s.jitter_s,
                   rng=random.Random(seed))

    def next_restart(self, now: float) -> tuple[int, float] | None:
        """A death at `now`: `(attempt within the window, back-off in seconds)`, recorded as a restart, or
        None when `max_restarts` restarts already happened within the window (the process is given up)."""
        while self.restarts and now - self.restarts[0] > self.window_s:
            self.restarts.popleft()
        if len(self.restarts) >= self.max_restarts:
            return None
        self.restarts.append(now)
        self.total += 1
        attempt = len(self.restarts)
        return attempt, backoff_s(attempt, self.backoff_initial_s, self.backoff_max_s, self.jitter_s, self.rng)
