"""The built-in scorers: most are a pure per-item function from `scoring.py` lifted by `per_item`; the
embedding scorer batches one encode; the LLM judge is async; the composite calls other registered scorers
(through `runner.run_scorer`) and sums them by weight. `default_registry()` is the service's registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from searchr1.core.clients.reward import ScoreItem
from searchr1.reward import scoring
from searchr1.reward.params import (
    CompositeParams,
    EmbeddingParams,
    FormatParams,
    JudgeParams,
    NoParams,
    SearchCostParams,
    SearchR1EMParams,
    SearchR1FormatParams,
)
from searchr1.reward.registry import Registry, Scored, ScorerInputError, ScorerSpec, ScoringContext
from searchr1.reward.runner import run_scorer


def per_item(name: str, fn: Callable[[ScoreItem, Any], float]) -> Callable[..., list[Scored]]:
    """Lift a per-item scorer to a batch scorer whose breakdown is `{name: score}`."""

    def run(items: Sequence[ScoreItem], params: Any, ctx: ScoringContext) -> list[Scored]:
        out = []
        for item in items:
            value = float(fn(item, params))
            out.append((value, {name: value}))
        return out

    return run


def _searchr1_gt(item: ScoreItem) -> dict:
    return {"target": item.golds}


def _run_searchr1_em_format(items: Sequence[ScoreItem], p: SearchR1FormatParams, ctx: ScoringContext) -> list[Scored]:
    out = []
    for item in items:
        b = scoring.searchr1_em_format_breakdown(item.full_text, _searchr1_gt(item), **p.model_dump())
        out.append((b.score, {"searchr1_em_format": b.score, "valid_format": float(b.valid_format),
                              "retrieval_correct": float(b.retrieval_correct), "has_answer": float(b.has_answer),
                              "answer_correct": float(b.answer_correct)}))
    return out


def _num_searches(item: ScoreItem) -> int:
    return item.num_searches if item.num_searches is not None else scoring.count_searches(item.response or "")


def _search_cost(item: ScoreItem, p: SearchCostParams) -> float:
    if p.charge == "if_correct" and not scoring.exact_match(item.response or "", item.golds):
        return 0.0
    return scoring.search_cost(_num_searches(item), p.cost_per_search, p.free_searches, p.max_cost)


def _run_embedding(items: Sequence[ScoreItem], p: EmbeddingParams, ctx: ScoringContext) -> list[Scored]:
    if ctx.encoder is None:
        raise ScorerInputError("scorer 'embedding_similarity' is not available: no encoder configured")
    answers = [scoring.extract_answer(item.response or "") for item in items]
    texts: list[str] = []
    for answer, item in zip(answers, items, strict=True):
        if answer is not None and item.golds:
            texts.append(answer)
            texts.extend(item.golds)
    vectors = ctx.encoder(p.model).encode(texts) if texts else []
    out: list[Scored] = []
    pos = 0
    for answer, item in zip(answers, items, strict=True):
        value = 0.0
        if answer is not None and item.golds:
            n = len(item.golds)
            value = scoring.best_similarity(vectors[pos], vectors[pos + 1: pos + 1 + n], p.clip_negative)
            pos += 1 + n
        out.append((value, {"embedding_similarity": value}))
    return out


def question_of(prompt: str) -> str:
    """The question inside a Search-R1 prompt (after the last `Question:`), else the whole prompt."""
    _, sep, tail = prompt.rpartition("Question:")
    text = tail if sep else prompt
    for marker in ("<|im_end|>", "<|eot_id|>", "</s>"):
        text = text.split(marker, 1)[0]
    return text.strip()


async def _run_judge(items: Sequence[ScoreItem], p: JudgeParams, ctx: ScoringContext) -> list[Scored]:
    if ctx.judge is None:
        raise ScorerInputError("scorer 'llm_judge' is not available: no judge endpoint configured "
                               "(set REWARD_JUDGE__URL)")
    judge = ctx.judge

    async def one(item: ScoreItem) -> Scored:
        answer = scoring.extract_answer(item.response or "")
        if answer is None or not item.golds:
            return 0.0, {"llm_judge": 0.0}
        value = await judge.judge(question_of(item.prompt or ""), answer, item.golds, p)
        return value, {"llm_judge": value}

    return list(await asyncio.gather(*(one(i) for i in items)))


async def _run_composite(items: Sequence[ScoreItem], p: CompositeParams, ctx: ScoringContext) -> list[Scored]:
    totals = [0.0] * len(items)
    breakdowns: list[dict[str, float]] = [{} for _ in items]
    for comp in p.components:
        results = await run_scorer(ctx, comp.scorer, items, comp.params)
        for i, (value, parts) in enumerate(results):
            totals[i] += comp.weight * value
            breakdowns[i][comp.key] = value
            # a component's own facts (e.g. searchr1_em_format's answer_correct) as "<key>.<fact>"
            breakdowns[i].update({f"{comp.key}.{k}": v for k, v in parts.items() if k != comp.scorer})
    return list(zip(totals, breakdowns, strict=True))


def _em(item: ScoreItem, p: SearchR1EMParams) -> float:
    return scoring.searchr1_em(item.full_text, _searchr1_gt(item), p.format_score, p.score)


def _subem(item: ScoreItem, p: SearchR1EMParams) -> float:
    return scoring.searchr1_subem(item.full_text, _searchr1_gt(item), p.format_score, p.score)


SCORERS: tuple[ScorerSpec, ...] = (
    ScorerSpec("searchr1_em", SearchR1EMParams, per_item("searchr1_em", _em),
               "Search-R1 qa_em.compute_score_em on prompt+response (>=2 <answer> matches, last wins).", "any"),
    ScorerSpec("searchr1_subem", SearchR1EMParams, per_item("searchr1_subem", _subem),
               "Search-R1 qa_em.compute_score_subem on prompt+response (gold is a substring).", "any"),
    ScorerSpec("searchr1_em_format", SearchR1FormatParams, _run_searchr1_em_format,
               "Search-R1 qa_em_format.compute_score_em: EM plus the tag state machine and retrieval bonus.", "any"),
    ScorerSpec("exact_match", NoParams,
               per_item("exact_match", lambda it, p: scoring.exact_match(it.response or "", it.golds)),
               "1 when the response's last <answer> normalises to a gold answer."),
    ScorerSpec("substring_match", NoParams,
               per_item("substring_match", lambda it, p: scoring.substring_match(it.response or "", it.golds)),
               "1 when a normalised gold answer is inside the normalised last <answer>."),
    ScorerSpec("f1", NoParams,
               per_item("f1", lambda it, p: scoring.f1_score(it.response or "", it.golds)),
               "Best SQuAD token F1 of the last <answer> against the gold answers."),
    ScorerSpec("format", FormatParams,
               per_item("format", lambda it, p: scoring.format_score(it.response or "", p.end_markers)),
               "1 when the response follows think -> (search -> information -> think)* -> answer."),
    ScorerSpec("retrieval_hit", NoParams,
               per_item("retrieval_hit", lambda it, p: scoring.retrieval_hit(it.response or "", it.golds)),
               "1 when a gold answer appears in an <information> block of the response."),
    ScorerSpec("search_cost", SearchCostParams,
               per_item("search_cost", _search_cost),
               "-cost_per_search per search beyond free_searches, floored at -max_cost (optionally only when "
               "the answer is correct)."),
    ScorerSpec("embedding_similarity", EmbeddingParams, _run_embedding,
               "Cosine similarity (MiniLM by default) between the last <answer> and the best gold answer.",
               cpu_heavy=True),
    ScorerSpec("llm_judge", JudgeParams, _run_judge,
               "An LLM judge (OpenAI-compatible chat endpoint) grades the last <answer>; cached, retried."),
    ScorerSpec("composite", CompositeParams, _run_composite,
               "Weighted sum of other scorers; the breakdown holds each component's raw score."),
)
"""The built-in scorers."""


def default_registry() -> Registry:
    return Registry(SCORERS)
