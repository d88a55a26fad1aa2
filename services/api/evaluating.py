"""Evaluate a policy on a test set from your own code: `searchr1 eval`'s runner (every question through the
agent loop, greedy and K sampled, the same aggregation and reports: eval.json, eval.md) with your search
function or index, scored in this process by the reward service's scorers (`LocalScorer`) unless you give a
reward service URL.

Returns the `EvalRun`: `.document["summary"]` holds the metrics overall and per group (Search-R1 EM, EM,
cover EM, F1, format, searches, failed searches, unscored), `.records` every scored trajectory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from searchr1.api.asking import ask_settings
from searchr1.api.scoring import LocalScorer, run_sync
from searchr1.api.search import RetrieverSearch, as_search_fn, serve_index
from searchr1.rollout.evaluation.evaluate import EvalConfig, EvalRun


async def evaluate_async(model: str | Path, data: str | Path, *, out: str | Path,
                         search: Callable[[str], Any] | None = None, retriever: str | None = None,
                         index: str | Path | None = None, token: str | None = None, reward: str | None = None,
                         reward_token: str | None = None, samples: int = 0, temperature: float = 1.0, seed: int = 0,
                         limit: int | None = None, concurrency: int = 16, group_by: Sequence[str] = ("data_source",),
                         **options: Any) -> EvalRun:
    """`evaluate` inside an event loop."""
    import contextlib

    from searchr1.core.clients.reward import RewardClient
    from searchr1.core.models import require_model_dir
    from searchr1.rollout.engine import HfCodec
    from searchr1.rollout.evaluation.evaluate import evaluate as run_evaluation
    from searchr1.rollout.service import start_generator
    from searchr1.rollout.settings import EvalSettings

    if sum(x is not None for x in (search, retriever, index)) != 1:
        raise ValueError("give exactly one of search= (a function), retriever= (an address) or index= (a directory)")
    require_model_dir(model)
    settings = ask_settings(model, **{"temperature": None, **options})
    config = EvalConfig.from_settings(settings.agent, EvalSettings(group_by=list(group_by)), seed=seed,
                                      temperature=temperature, max_context_tokens=settings.engine.max_model_len,
                                      samples=samples, concurrency=concurrency)
    async with contextlib.AsyncExitStack() as stack:
        if index is not None:
            search = await stack.enter_async_context(serve_index(index, top_k=settings.retriever.top_k))
        elif retriever is not None:
            client = RetrieverSearch(retriever, top_k=settings.retriever.top_k, token=token)
            stack.push_async_callback(client.close)
            search = client
        assert search is not None
        scorer: Any = LocalScorer()
        if reward is not None:
            scorer = RewardClient(reward, token=reward_token)
            stack.push_async_callback(scorer.close)
        generator = await start_generator(str(model), settings.engine)
        stack.push_async_callback(generator.close)
        tokenizer = generator.tokenizer()  # type: ignore[attr-defined]
        return await run_evaluation(data, out, generator, HfCodec(tokenizer), tokenizer, as_search_fn(search), scorer,
                                    config, limit=limit, meta={"model": str(model), "engine": settings.engine.kind})


def evaluate(model: str | Path, data: str | Path, **kwargs: Any) -> EvalRun:
    """Evaluate `model` on `data` (a Search-R1 parquet or our tasks JSONL; keyword arguments as
    `evaluate_async`): exactly one of `search=`, `retriever=`, `index=`; `out=` the report directory."""
    return run_sync(evaluate_async(model, data, **kwargs))
