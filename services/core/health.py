"""Collapse signals: per-trajectory features of a response and their per-step aggregates.

A run that collapses shows it in its text before its reward: malformed tags, the same query searched
again and again, no searches at all, answers or `<think>` blocks that grow or vanish, responses cut at the
token limit. These pure functions compute those figures from what every trajectory carries (its response
text, search count and finish reason); the learner exports them per step (`searchr1_learner_<name>`) and
the trajectory viewer plots them. The trainer's own signals (entropy, KL, importance-ratio extremes,
gradient norm, non-finite counts) come from the trainer's figures.

Model text is parsed with the linear tag scanner (`searchr1.core._tag_scan`), never a non-greedy regular
expression: a flood of opening tags would cost a regex n² steps while holding the GIL on the learner's loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from searchr1.core._tag_scan import contents
from searchr1.core.protocol import extract_answer, is_well_formed, normalize_answer

SIGNALS = {
    "malformed_rate": "Share of the step's responses that break the tag grammar (think, search, answer).",
    "repeated_query_rate": "Share of the step's search queries that repeat an earlier query of the same response.",
    "searches_mean": "Mean searches per response (complete <search> calls).",
    "answer_words_mean": "Mean words in the final <answer> (0 without one).",
    "think_words_mean": "Mean words over all <think> blocks of a response.",
    "truncated_rate": "Share of responses that hit the token limit (finish reason `length`).",
}
"""The per-step collapse signals `step_signals` returns, with their meaning."""


@dataclass(frozen=True)
class TextFeatures:
    """What one response shows of its health."""

    malformed: bool
    queries: int
    repeated_queries: int
    answer_words: int
    think_words: int


def queries(text: str) -> list[str]:
    """The response's search queries in order, normalized (lower case, no punctuation or articles)."""
    return [normalize_answer(q) for q in contents(text, "search")]


def repeated(items: Sequence[str]) -> int:
    """How many items repeat an earlier one (`[a, b, a, a]` → 2)."""
    return len(items) - len(set(items))


def text_features(text: str) -> TextFeatures:
    """Features of one response text."""
    qs = queries(text)
    answer = extract_answer(text)
    think = " ".join(contents(text, "think"))
    return TextFeatures(malformed=not is_well_formed(text), queries=len(qs), repeated_queries=repeated(qs),
                        answer_words=len(answer.split()) if answer else 0, think_words=len(think.split()))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def step_signals(texts: Sequence[str], searches: Iterable[int], finish_reasons: Iterable[str]) -> dict[str, float]:
    """The `SIGNALS` of one step's responses. `repeated_query_rate` is over queries (0 when none was
    searched); the other rates and means are over responses (all 0 for an empty step)."""
    feats = [text_features(t) for t in texts]
    total_queries = sum(f.queries for f in feats)
    finish = list(finish_reasons)
    return {
        "malformed_rate": _mean([float(f.malformed) for f in feats]),
        "repeated_query_rate": sum(f.repeated_queries for f in feats) / total_queries if total_queries else 0.0,
        "searches_mean": _mean([float(s) for s in searches]),
        "answer_words_mean": _mean([float(f.answer_words) for f in feats]),
        "think_words_mean": _mean([float(f.think_words) for f in feats]),
        "truncated_rate": _mean([float(r == "length") for r in finish]),
    }
