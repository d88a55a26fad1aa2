"""Pure reward math on strings: Search-R1's exact scorers and our response-only scorers (EM, substring,
token F1, format, retrieval hit, search cost, cosine similarity). No I/O, no models, no logging: strings
(or vectors) in, numbers out. The text protocol they read (answer extraction, normalisation, the format
grammar) is `searchr1.core.protocol`'s; this module only composes scores from it. The registry
(`registry.py`) wires these to names and parameter models; the service calls them through it.

Search-R1 compatibility (`searchr1_em`, `searchr1_subem`, `searchr1_em_format`) is bug-for-bug with
Search-R1's `verl/utils/reward_score/qa_em.py` and `qa_em_format.py` (docs/architecture.md,
"Reward semantics"):
- they score the decoded prompt + response (special tokens kept), and the `<answer>` extraction needs
  at least two matches and takes the last: the Search-R1 prompt itself holds two (`<answer> and
  </answer>` and `<answer> Beijing </answer>`), so a response without an answer extracts `Beijing`, and
  one that ends with the invalid-action message extracts `and`;
- the format variant's retrieval check scans every `<information>` block of the whole text, prompt
  included (the prompt's `<information> and </information>` counts), and an answer that normalises to
  the empty string is a substring of everything;
- a decoded `<|im_end|>` after the final `</answer>` makes the format invalid (text after the end state).
Search-R1's random 1-in-64 debug print is left out.

Our scorers depart on purpose: they see the response alone, the last `<answer>…</answer>` wins (one is
enough), no answer scores 0, and a gold answer that normalises to nothing never matches.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from searchr1.core.protocol import (
    DEFAULT_END_MARKERS,
    extract_answer,
    information_blocks,
    is_well_formed,
    normalize_answer,
    searchr1_extract_solution,
    searchr1_is_valid_sequence,
)
from searchr1.core.protocol import count_searches as count_searches  # read by the registry as a scorer input

# The scorers' defaults, declared once: the functions below and the scorers' parameter models
# (`reward/params.py`, what a request or `[reward] scorer_params` may set) take them from here.
SCORE = 1.0
"""Score of a correct answer (Search-R1's `score`)."""
FORMAT_SCORE = 0.0
"""Search-R1's `format_score`: an extracted but wrong answer (`qa_em`); unused (`qa_em_format`)."""
STRUCTURE_FORMAT_SCORE = 0.0
"""Search-R1's `structure_format_score` (`qa_em_format`)."""
FINAL_FORMAT_SCORE = 0.0
"""Search-R1's `final_format_score` (`qa_em_format`)."""
RETRIEVAL_SCORE = 0.0
"""Search-R1's `retrieval_score` (`qa_em_format`)."""
COST_PER_SEARCH = 0.1
"""`search_cost`: the cost of each search beyond the free ones."""
FREE_SEARCHES = 0
"""`search_cost`: searches that cost nothing."""
MAX_COST = 1.0
"""`search_cost`: the cost never exceeds this."""
CLIP_NEGATIVE = True
"""`best_similarity`: negative cosines count as 0."""

# --------------------------------------------------------------------------------------------------
# Matching primitives (Search-R1 semantics: any gold, normalised)
# --------------------------------------------------------------------------------------------------


def _as_list(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else list(golds)


def em_check(prediction: str, golds: str | Iterable[str]) -> bool:
    """Any normalised gold equals the normalised prediction (Search-R1 `em_check`)."""
    pred = normalize_answer(prediction)
    return any(normalize_answer(g) == pred for g in _as_list(golds))


def subem_check(prediction: str, golds: str | Iterable[str]) -> bool:
    """Any normalised gold is a substring of the normalised prediction (Search-R1 `subem_check`)."""
    pred = normalize_answer(prediction)
    return any(normalize_answer(g) in pred for g in _as_list(golds))


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 between two answers after normalisation (0 when either side has no tokens)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return 0.0
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


# --------------------------------------------------------------------------------------------------
# Search-R1's retrieval check
# --------------------------------------------------------------------------------------------------


def searchr1_is_retrieval_correct(text: str, golds: str | Iterable[str]) -> bool:
    """Search-R1's `is_retrieval_correct`: some normalised gold is a substring of some normalised
    `<information>` block anywhere in `text` (prompt included). Note a bare string `golds` is iterated
    character by character, as in Search-R1."""
    golds = list(golds)
    for block in information_blocks(text):
        norm = normalize_answer(block)
        if any(normalize_answer(g) in norm for g in golds):
            return True
    return False


# --------------------------------------------------------------------------------------------------
# Search-R1 scorers (full prompt + response text)
# --------------------------------------------------------------------------------------------------


def searchr1_em(solution_str: str, ground_truth: dict, format_score: float = FORMAT_SCORE,
                score: float = SCORE) -> float:
    """`qa_em.compute_score_em`: `score` if the extracted answer exactly matches a gold, else
    `format_score`; 0 when nothing is extracted."""
    answer = searchr1_extract_solution(solution_str)
    if answer is None:
        return 0.0
    return float(score) if em_check(answer, ground_truth["target"]) else float(format_score)


def searchr1_subem(solution_str: str, ground_truth: dict, format_score: float = FORMAT_SCORE,
                   score: float = SCORE) -> float:
    """`qa_em.compute_score_subem`: as `searchr1_em` with a substring match."""
    answer = searchr1_extract_solution(solution_str)
    if answer is None:
        return 0.0
    return float(score) if subem_check(answer, ground_truth["target"]) else float(format_score)


@dataclass(frozen=True, slots=True)
class FormatBreakdown:
    """The facts `searchr1_em_format` decides on, for the component breakdown."""

    score: float
    valid_format: bool
    retrieval_correct: bool
    has_answer: bool
    answer_correct: bool


def searchr1_em_format_breakdown(
    solution_str: str,
    ground_truth: dict,
    structure_format_score: float = STRUCTURE_FORMAT_SCORE,
    final_format_score: float = FINAL_FORMAT_SCORE,
    retrieval_score: float = RETRIEVAL_SCORE,
    format_score: float = FORMAT_SCORE,
    score: float = SCORE,
) -> FormatBreakdown:
    """`qa_em_format.compute_score_em` with the facts it used. `format_score` is accepted and unused,
    exactly as in Search-R1."""
    del format_score
    golds = ground_truth["target"]
    valid, _ = searchr1_is_valid_sequence(solution_str)
    retrieval = searchr1_is_retrieval_correct(solution_str, golds) if valid else False
    answer = searchr1_extract_solution(solution_str)
    if answer is None:
        if valid:
            value = structure_format_score + retrieval_score if retrieval else structure_format_score
        else:
            value = 0.0
        return FormatBreakdown(float(value), valid, retrieval, False, False)
    correct = em_check(answer, golds)
    if correct:
        value = score if valid else score - structure_format_score
    elif valid:
        value = structure_format_score + retrieval_score if retrieval else structure_format_score
    else:
        value = final_format_score
    return FormatBreakdown(float(value), valid, retrieval, True, correct)


def searchr1_em_format(
    solution_str: str,
    ground_truth: dict,
    structure_format_score: float = STRUCTURE_FORMAT_SCORE,
    final_format_score: float = FINAL_FORMAT_SCORE,
    retrieval_score: float = RETRIEVAL_SCORE,
    format_score: float = FORMAT_SCORE,
    score: float = SCORE,
) -> float:
    """`qa_em_format.compute_score_em`: no answer → `structure_format_score` if
    well-formed (+ `retrieval_score` when a gold is in an `<information>` block) else 0; correct → `score`
    if well-formed else `score - structure_format_score`; wrong → `structure_format_score`
    (+ `retrieval_score`) if well-formed else `final_format_score`."""
    return searchr1_em_format_breakdown(solution_str, ground_truth, structure_format_score, final_format_score,
                                        retrieval_score, format_score, score).score


# --------------------------------------------------------------------------------------------------
# Our response-only scorers
# --------------------------------------------------------------------------------------------------


def _golds(golds: Iterable[str]) -> list[str]:
    """Normalised, non-empty golds (an empty gold would match everything)."""
    return [n for n in (normalize_answer(g) for g in golds) if n]


def exact_match(response: str, golds: Sequence[str]) -> float:
    """1 when the last answer of the response normalises to a gold answer; 0 otherwise or without one."""
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    pred = normalize_answer(answer)
    return float(any(pred == g for g in _golds(golds)))


def substring_match(response: str, golds: Sequence[str]) -> float:
    """1 when a normalised gold answer is contained in the normalised last answer."""
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    pred = normalize_answer(answer)
    return float(any(g in pred for g in _golds(golds)))


def f1_score(response: str, golds: Sequence[str]) -> float:
    """Best SQuAD token F1 of the last answer against any gold answer; 0 without an answer."""
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    return max((token_f1(answer, g) for g in golds), default=0.0)


def format_score(response: str, end_markers: Iterable[str] = DEFAULT_END_MARKERS) -> float:
    """1 when the response alone follows Search-R1's tag grammar (think → (search → information →
    think)* → answer, balanced tags, only whitespace between them), ignoring trailing end-of-turn
    markers of any chat template; else 0."""
    return float(is_well_formed(response, end_markers))


def retrieval_hit(response: str, golds: Sequence[str]) -> float:
    """1 when a normalised gold answer appears in a normalised `<information>` block of the response."""
    norm_golds = _golds(golds)
    for block in information_blocks(response):
        norm = normalize_answer(block)
        if any(g in norm for g in norm_golds):
            return 1.0
    return 0.0


def search_cost(num_searches: int, cost_per_search: float = COST_PER_SEARCH,
                free_searches: int = FREE_SEARCHES, max_cost: float = MAX_COST) -> float:
    """A non-positive reward: `-cost_per_search` per search beyond `free_searches`, floored at `-max_cost`."""
    if num_searches < 0:
        raise ValueError("num_searches must be >= 0")
    return -min(max_cost, cost_per_search * max(0, num_searches - free_searches))


def cosine_similarity(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine of two vectors (0 when either is zero)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return dot / (na * nb)


def best_similarity(answer_vec: Sequence[float], gold_vecs: Sequence[Sequence[float]],
                    clip_negative: bool = CLIP_NEGATIVE) -> float:
    """Highest cosine between the answer and any gold, clipped to [0, 1] (or [-1, 1])."""
    best = max((cosine_similarity(answer_vec, g) for g in gold_vecs), default=0.0)
    best = min(1.0, max(-1.0, best))
    return max(0.0, best) if clip_negative else best


def parse_judge_verdict(text: str) -> float | None:
    """Read an LLM judge's verdict: the first word `yes`/`correct`/`true` → 1, `no`/`incorrect`/`false`
    → 0, a leading number in [0, 1] → that number; anything else → None."""
    cleaned = text.strip().strip("*`\"' ").lower()
    m = re.match(r"([01](?:\.\d+)?)\b", cleaned)
    if m:
        value = float(m.group(1))
        return value if 0.0 <= value <= 1.0 else None
    word = re.match(r"[a-z]+", cleaned)
    if word is None:
        return None
    if word.group(0) in ("yes", "correct", "true"):
        return 1.0
    if word.group(0) in ("no", "incorrect", "false", "wrong"):
        return 0.0
    return None
