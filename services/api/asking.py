"""Ask a policy a question (Search-R1's `infer.py`): the question through Search-R1's prompt, the real agent
loop (stop at `</search>` or `</answer>`, search, resume) on one engine, greedy unless told otherwise, and
the trajectory back as a reader wants it — think, search, information, answer (`AskResult.turns`).

`open_asker(model, search=…)` starts the engine once and answers any number of questions; `ask(question,
model=…)` is the one-shot form for scripts and notebooks. The search comes from your own function, a running
retriever (gRPC or a Search-R1 `/retrieve` URL) or an index directory served in this process
(`searchr1.api.search`). Engine, limits and sampling are the rollout worker's settings (`RolloutSettings`:
a run config's `[rollout]` table, `ROLLOUT_…` variables, then these arguments), so an answer here is one a
worker of that run would have sampled at the same temperature.

What this module does not do: score answers (`searchr1.api.scoring`) or run test sets
(`searchr1.api.evaluating`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from searchr1.api.search import RetrieverSearch, as_search_fn, serve_index
from searchr1.core.protocol import render_prompt, tag_segments
from searchr1.core.settings import load_settings
from searchr1.rollout.agent import AgentLimits, Sampling, run_trajectory
from searchr1.rollout.engine import Generator, HfCodec
from searchr1.rollout.settings import RolloutSettings

TURN_KINDS = ("think", "search", "information", "answer")

GREEDY = 0.0
"""The temperature `ask` decodes at unless told otherwise: Search-R1's infer.py answers greedily."""


@dataclass(frozen=True)
class Turn:
    """One block of a response: `kind` think | search | information | answer | text (anything outside
    the tags, e.g. Search-R1's invalid-action message), and its text without the tags."""

    kind: str
    text: str


def turns_of(response: str) -> list[Turn]:
    """A response cut into its protocol blocks, in order (whitespace-only gaps left out)."""
    out = []
    for segment, tag in tag_segments(response):
        if tag is None:
            if segment.strip():
                out.append(Turn("text", segment.strip()))
            continue
        out.append(Turn(tag, segment[len(tag) + 2: -(len(tag) + 3)].strip()))
    return out


@dataclass
class AskResult:
    """One question's trajectory."""

    question: str
    answer: str | None
    """The `<answer>` the policy gave (None when it gave none)."""
    response: str
    """Everything after the prompt: the policy's turns and the environment's observations."""
    finish_reason: str
    """answer, eos, max_turns, length, or a failure: retriever_unavailable, search_budget, error."""
    num_searches: int
    num_turns: int
    generated_tokens: int
    prompt: str = field(repr=False, default="")
    error: str | None = None
    """Why the environment failed the trajectory (a search that failed), or None."""

    @property
    def turns(self) -> list[Turn]:
        return turns_of(self.response)

    @property
    def searches(self) -> list[str]:
        """The queries it searched, in order."""
        return [t.text for t in self.turns if t.kind == "search"]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "turns": [asdict(t) for t in self.turns]}


class Asker:
    """Answers questions on one started engine with one search function (see the module docstring)."""

    def __init__(self, generator: Generator, search: Callable[[str], Any], settings: RolloutSettings, *,
                 seed: int | None = None) -> None:
        """`seed`: the sampling seed of every question (matters with a temperature above 0; None: the
        engine's)."""
        self.generator = generator
        self.tokenizer = generator.tokenizer()  # type: ignore[attr-defined]
        self.codec = HfCodec(self.tokenizer)
        self.search = as_search_fn(search)
        self.settings = settings
        self.seed = seed
        self._ids = itertools.count()

    async def ask(self, question: str, *, temperature: float | None = None, seed: int | None = None) -> AskResult:
        """One question through the agent loop (the asker's temperature unless given; 0 = greedy)."""
        s = self.settings
        prompt = render_prompt(question, self.tokenizer, s.agent.template)
        limits = AgentLimits.from_settings(s.agent, max_context_tokens=s.engine.max_model_len)
        sampling = Sampling.from_settings(s.agent, seed=self.seed if seed is None else seed, temperature=temperature)
        res = await run_trajectory(self.codec.encode(prompt), self.generator, self.codec, self.search, limits,
                                   sampling, f"ask-{next(self._ids)}")
        return AskResult(question=question, answer=res.answer, response=self.codec.decode(res.response_ids),
                         finish_reason=res.finish_reason, num_searches=res.num_searches, num_turns=res.num_turns,
                         generated_tokens=res.generated_tokens, prompt=prompt, error=res.error)


def ask_settings(model: str | Path, *, config: str | Path | None = None, engine: str | None = None,
                 temperature: float | None = GREEDY, max_turns: int | None = None,
                 max_tokens_per_turn: int | None = None, top_k: int | None = None,
                 **overrides: Any) -> RolloutSettings:
    """The rollout settings an asker runs with: the run config's `[rollout]` table and `ROLLOUT_…`
    variables, these arguments over them (greedy unless `temperature` says otherwise; None keeps the
    config's). Raises ValueError (pydantic's, or the config's) for values it cannot use."""
    return load_settings(RolloutSettings, config, model=str(model), engine__kind=engine,
                         agent__temperature=temperature, agent__max_turns=max_turns,
                         agent__max_tokens_per_turn=max_tokens_per_turn, retriever__top_k=top_k, **overrides)


@contextlib.asynccontextmanager
async def open_asker(model: str | Path, *, search: Callable[[str], Any] | None = None,
                     retriever: str | list[str] | None = None, index: str | Path | None = None,
                     token: str | None = None, settings: RolloutSettings | None = None, seed: int | None = None,
                     **options: Any) -> AsyncIterator[Asker]:
    """Start an engine on `model` and yield an `Asker`; everything is stopped on exit.

    Exactly one search source: `search` (your function: query → hits), `retriever` (a running retriever:
    `host:port` or a `/retrieve` URL; `token` if it needs one) or `index` (an index directory served in
    this process). `settings` (else `ask_settings(model, **options)`) gives engine, limits and sampling."""
    from searchr1.core.models import require_model_dir
    from searchr1.rollout.service import start_generator

    if sum(x is not None for x in (search, retriever, index)) != 1:
        raise ValueError("give exactly one of search= (a function), retriever= (an address) or index= (a directory)")
    settings = settings or ask_settings(model, **options)
    require_model_dir(model)
    async with contextlib.AsyncExitStack() as stack:
        if index is not None:
            search = await stack.enter_async_context(serve_index(index, top_k=settings.retriever.top_k))
        elif retriever is not None:
            client = RetrieverSearch(retriever, top_k=settings.retriever.top_k, token=token,
                                     retry=settings.retriever.retry_policy())
            stack.push_async_callback(client.close)
            search = client
        generator = await start_generator(str(model), settings.engine)
        stack.push_async_callback(generator.close)
        assert search is not None
        yield Asker(generator, search, settings, seed=seed)


async def ask_async(question: str, model: str | Path, **kwargs: Any) -> AskResult:
    """`ask` inside an event loop."""
    async with open_asker(model, **kwargs) as asker:
        return await asker.ask(question)


def ask(question: str, model: str | Path, **kwargs: Any) -> AskResult:
    """Ask `model` one question (keyword arguments as `open_asker`'s): the engine starts, answers and
    stops. For several questions keep one `open_asker` open."""
    from searchr1.api.scoring import run_sync

    return run_sync(ask_async(question, model, **kwargs))
