"""What one trajectory asks of the pipeline: its turns (tokens to prefill, tokens to generate, a search
after each turn but the last) and the tokens the learner trains on. Pure and seeded.

A run's own figures give the means (`calibrate.py`: generated tokens, turns and searches per trajectory
from the rollout's counters, trained tokens per step from the learner's step log); a recipe's give its
bounds (`max_turns`, `max_tokens_per_turn`, `max_obs_tokens`). Searches per trajectory take the two
whole numbers around their mean (so the mean is exact and the spread the least a mean allows); tokens per
turn are gamma-distributed around their mean with coefficient of variation `length_cv`, cut at the turn's
bound (0: every turn the same, for hand-checked cases).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Trajectory:
    turns: tuple[tuple[int, int], ...]
    """Per turn: (tokens to prefill before it, tokens it generates)."""
    trained_tokens: int
    """Prompt + generated + observation tokens: what the learner trains on."""


@dataclass(frozen=True)
class Workload:
    prompt_tokens: float
    """Prompt tokens per trajectory (prefilled before the first turn)."""
    generated_tokens: float
    """Tokens the policy generates per trajectory, over all its turns."""
    searches: float
    """Searches per trajectory (each between two turns)."""
    obs_tokens: float
    """Observation tokens per search (prefilled before the next turn)."""
    max_turns: int = 4
    """Searches allowed (`rollout.agent.max_turns`); a trajectory has at most max_turns + 1 turns."""
    max_tokens_per_turn: int = 500
    length_cv: float = 0.5
    """Spread of tokens per turn (coefficient of variation; 0: fixed)."""

    def __post_init__(self) -> None:
        if self.searches < 0 or self.searches > self.max_turns:
            raise ValueError(f"searches per trajectory must be in [0, max_turns={self.max_turns}], got {self.searches}")
        if min(self.prompt_tokens, self.generated_tokens, self.obs_tokens) < 0 or self.length_cv < 0:
            raise ValueError("token counts and length_cv must be >= 0")

    @property
    def turns(self) -> float:
        return self.searches + 1

    @property
    def trained_tokens(self) -> float:
        """Mean trained tokens per trajectory."""
        return self.prompt_tokens + self.generated_tokens + self.searches * self.obs_tokens


def sample(w: Workload, rng: random.Random) -> Trajectory:
    """One trajectory of `w` (see the module docstring)."""
    lo = math.floor(w.searches)
    searches = lo + (1 if rng.random() < w.searches - lo else 0)
    per_turn = w.generated_tokens / w.turns
    turns = []
    for i in range(searches + 1):
        if w.length_cv > 0 and per_turn > 0:
            shape = 1.0 / w.length_cv ** 2
            tokens = rng.gammavariate(shape, per_turn / shape)
        else:
            tokens = per_turn
        gen = max(1, min(w.max_tokens_per_turn, round(tokens)))
        prefill = round(w.prompt_tokens if i == 0 else w.obs_tokens)
        turns.append((prefill, gen))
    trained = round(w.prompt_tokens) + sum(g for _, g in turns) + round(w.obs_tokens) * searches
    return Trajectory(tuple(turns), trained)
