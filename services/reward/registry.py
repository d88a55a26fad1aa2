"""The scorer registry: every scorer by name with its pydantic parameter model, the item shape it needs and
how it runs. `GET /v1/scorers` lists it; `POST /v1/score` selects from it by name (no if-ladder).

What a scorer is: `run(items, params, ctx) -> list[Scored]` over a batch. Most scorers are a pure
per-item function from `scoring.py`; the built-in scorers live in `scorers.py`.
Resources (the lazily loaded encoder, the judge client) come in through `ScoringContext`, never from
globals.

Parameter precedence: request `params` over the server config's `scorer_params[name]` over the model's
defaults. Parameter models forbid unknown keys, so a typo is a 422, not a silently ignored setting.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from searchr1.core.clients.reward import ScoreItem
from searchr1.reward.params import (  # noqa: F401  (re-exported: the registry's public parameter models)
    DEFAULT_JUDGE_PROMPT,
    Component,
    CompositeParams,
    EmbeddingParams,
    FormatParams,
    JudgeParams,
    NoParams,
    Params,
    SearchCostParams,
    SearchR1EMParams,
    SearchR1FormatParams,
)

Scored = tuple[float, dict[str, float]]
"""One item's score and its component breakdown."""
Input = Literal["any", "response"]
"""`any`: either item shape (Search-R1 scorers use `prompt + response`); `response`: needs our shape."""


class ScorerInputError(ValueError):
    """A request the scorer cannot serve (unknown name, bad params, wrong item shape) → HTTP 422."""


class Encoder(Protocol):
    def encode(self, texts: Sequence[str]) -> list[list[float]]: ...


class Judge(Protocol):
    async def judge(self, question: str, prediction: str, golds: Sequence[str], params: JudgeParams) -> float: ...


@dataclass
class ScoringContext:
    """Resources scorers may use. `encoder(model)` returns a (cached) encoder for a model path or None
    for the default; `judge` is the LLM judge client (None when not configured)."""

    registry: Registry
    encoder: Callable[[str | None], Encoder] | None = None
    judge: Judge | None = None
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Config-side default params per scorer name."""
    executor: Executor | None = None
    """Thread pool for CPU-heavy or large batches (None: run on the caller's thread)."""
    inline_max_items: int = field(kw_only=True)
    """With an `executor`, batches of cheap scorers up to this size run on the event loop (a thread hop
    costs more): `[reward] inline_max_items`."""

    def params_for(self, name: str, params: dict[str, Any] | None) -> BaseModel:
        """Validate `params` for scorer `name`, over the config defaults."""
        spec = self.registry.get(name)
        merged = {**self.defaults.get(name, {}), **(params or {})}
        try:
            return spec.params.model_validate(merged)
        except ValidationError as exc:
            msgs = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'params'}: {e['msg']}" for e in exc.errors())
            raise ScorerInputError(f"invalid params for scorer {name!r}: {msgs}") from None


RunFn = Callable[[Sequence[ScoreItem], Any, ScoringContext], "list[Scored] | Awaitable[list[Scored]]"]


@dataclass(frozen=True)
class ScorerSpec:
    """One registered scorer."""

    name: str
    params: type[BaseModel]
    run: RunFn
    description: str
    input: Input = "response"
    cpu_heavy: bool = False
    """Runs in the thread pool even for small batches (model inference)."""

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.run)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input": self.input,
                "params": self.params.model_json_schema()}


class Registry:
    """An immutable name → ScorerSpec table."""

    def __init__(self, specs: Iterable[ScorerSpec]) -> None:
        self._specs: dict[str, ScorerSpec] = {}
        for spec in specs:
            if spec.name in self._specs:
                raise ValueError(f"scorer {spec.name!r} registered twice")
            self._specs[spec.name] = spec

    def get(self, name: str) -> ScorerSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise ScorerInputError(f"unknown scorer {name!r}; known: {', '.join(sorted(self._specs))}") from None

    def names(self) -> list[str]:
        return sorted(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def describe(self) -> list[dict[str, Any]]:
        return [self._specs[n].describe() for n in self.names()]


def check_items(spec: ScorerSpec, items: Sequence[ScoreItem]) -> None:
    """Refuse items whose shape the scorer cannot use."""
    if spec.input == "response":
        for i, item in enumerate(items):
            if item.response is None:
                raise ScorerInputError(
                    f"items[{i}]: scorer {spec.name!r} scores the response alone; send "
                    "{prompt, response, golden_answers} items (solution_str items are for searchr1_* scorers)")
