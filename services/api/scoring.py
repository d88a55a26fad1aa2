"""Scoring answers in your own code: the reward service's scorers called in-process (`score`,
`LocalScorer`), with the Search-R1 scorers' one trap closed.

Search-R1's `qa_em.compute_score_em` — our `searchr1_em` — scores the decoded *prompt + response* and takes
the last of at least two `<answer>` matches: its prompt holds two (`inside <answer> and </answer>`, `For
example, <answer> Beijing </answer>`), so a bare response with one correct answer extracts nothing and
scores 0. `score` therefore asks for the prompt of the `searchr1_*` scorers explicitly (`prompt=`, the text
the model saw), or for the question (`question=`: Search-R1's prompt is rendered from it, which is what the
scorers count on). Given neither it raises, naming the trap, instead of returning a silent 0. The scorers'
semantics are untouched: `score(..., prompt=p)` equals `searchr1_em(p + response, {"target": golds})`
bug for bug; the response-only scorers (`exact_match`, `substring_match` = cover EM, `f1`, `format`, …)
need neither.

What this module does not do: serve HTTP (`searchr1 serve reward`) or judge with an LLM you have not
configured (the `llm_judge` and `embedding_similarity` scorers need the reward service's settings).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from searchr1.core.clients.reward import ScoreItem, ScoreResult
from searchr1.core.protocol import render_prompt
from searchr1.reward.registry import ScoringContext
from searchr1.reward.runner import run_scorer
from searchr1.reward.scorers import default_registry

PROMPT_SCORERS = ("searchr1_em", "searchr1_subem", "searchr1_em_format")
"""Scorers that read prompt + response, as Search-R1's do."""

METRIC_ALIASES = {"em": "exact_match", "cover_em": "substring_match", "subem": "substring_match"}
"""Names the evaluation reports use, for the scorer that computes them."""


class ScoringError(ValueError):
    """A score request that cannot be served (unknown scorer, bad parameters, a missing prompt)."""


class LocalScorer:
    """The reward service's scorers in this process, with the `Scorer` interface the evaluation and the
    rollout worker call (`await scorer.score(name, items, params)` → `ScoreResult`)."""

    def __init__(self, defaults: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        from searchr1.reward.settings import RewardSettings

        self.ctx = ScoringContext(registry=default_registry(),
                                  defaults={k: dict(v) for k, v in (defaults or {}).items()},
                                  inline_max_items=RewardSettings().inline_max_items)

    def names(self) -> list[str]:
        return list(self.ctx.registry.names())

    async def score(self, scorer: str, items: Sequence[ScoreItem | Mapping[str, Any]],
                    params: Mapping[str, Any] | None = None) -> ScoreResult:
        from searchr1.reward.registry import ScorerInputError

        try:
            parsed = [i if isinstance(i, ScoreItem) else ScoreItem.model_validate(dict(i)) for i in items]
            results = await run_scorer(self.ctx, scorer, parsed, dict(params or {}))
        except (ScorerInputError, KeyError, ValueError) as exc:
            raise ScoringError(str(exc).strip("'\"")) from None
        return ScoreResult(scores=[v for v, _ in results], components=[c for _, c in results])

    async def close(self) -> None:
        """Nothing to release (the in-process scorers hold no connection); for the `Scorer` interface."""


def _item(response: str, golden_answers: Sequence[str] | str, scorer: str, prompt: str | None,
          question: str | None, num_searches: int | None) -> dict[str, Any]:
    golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    if scorer in PROMPT_SCORERS:
        if prompt is None and question is None:
            raise ScoringError(
                f"{scorer} scores prompt + response, as Search-R1 does: it takes the last of at least two "
                "<answer> matches and Search-R1's prompt holds two, so a bare response scores 0. Pass "
                "prompt= (the text the model saw) or question= (Search-R1's prompt is rendered from it), or use "
                "the response-only exact_match")
        if prompt is None:
            prompt = render_prompt(str(question))
    item: dict[str, Any] = {"prompt": prompt or "", "response": response, "golden_answers": golds}
    if num_searches is not None:
        item["num_searches"] = num_searches
    return item


async def score_async(response: str, golden_answers: Sequence[str] | str, *, scorer: str = "exact_match",
                      prompt: str | None = None, question: str | None = None, num_searches: int | None = None,
                      params: Mapping[str, Any] | None = None) -> float:
    """`score` inside an event loop."""
    name = METRIC_ALIASES.get(scorer, scorer)
    result = await LocalScorer().score(name, [_item(response, golden_answers, name, prompt, question, num_searches)],
                                       params)
    return float(result.scores[0])


def score(response: str, golden_answers: Sequence[str] | str, *, scorer: str = "exact_match",
          prompt: str | None = None, question: str | None = None, num_searches: int | None = None,
          params: Mapping[str, Any] | None = None) -> float:
    """One response's score under a reward scorer (`exact_match` by default; `em`, `cover_em` name the
    evaluation's metrics). The `searchr1_*` scorers need `prompt=` or `question=` (module docstring).
    Raises `ScoringError` for an unknown scorer, bad parameters or a missing prompt."""
    coro = score_async(response, golden_answers, scorer=scorer, prompt=prompt, question=question,
                       num_searches=num_searches, params=params)
    return run_sync(coro)


def run_sync(coro: Any) -> Any:
    """Run `coro` to completion from synchronous code: `asyncio.run`, or, when this thread already runs an
    event loop (a notebook cell), in a fresh loop on a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="searchr1-sync") as pool:
        return pool.submit(asyncio.run, coro).result()
