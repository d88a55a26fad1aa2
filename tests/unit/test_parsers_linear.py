"""Every parser of model text stays linear on floods of opening tags (and other repetitive text a policy
can emit): for each parser and flood, the CPU time of this thread at 4× the text is compared with the
same parser at 1× in the same run. A linear parser costs about 4×; a non-greedy regular expression
retried from every opening tag costs 16×. The threshold (8×) sits between them; the ratio, not a
duration, is asserted, and thread CPU time is what is measured, so a busy machine does not tip it."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from searchr1.core import health, protocol
from searchr1.reward import scoring
from searchr1.viewer import turns

GOLD = {"target": ["paris"]}
PARSERS: dict[str, Callable[[str], object]] = {
    "protocol.parse_action": protocol.parse_action,
    "protocol.extract_answer": protocol.extract_answer,
    "protocol.searchr1_extract_solution": protocol.searchr1_extract_solution,
    "protocol.tag_segments": protocol.tag_segments,
    "protocol.information_blocks": protocol.information_blocks,
    "protocol.count_searches": protocol.count_searches,
    "protocol.is_well_formed": protocol.is_well_formed,
    "protocol.searchr1_is_valid_sequence": protocol.searchr1_is_valid_sequence,
    "protocol.normalize_answer": protocol.normalize_answer,
    "health.text_features": health.text_features,
    "health.step_signals": lambda t: health.step_signals([t], [1], ["stop"]),
    "scoring.searchr1_em_format": lambda t: scoring.searchr1_em_format(t, GOLD, 0.2, 0.1, 0.1),
    "scoring.searchr1_subem": lambda t: scoring.searchr1_subem(t, GOLD),
    "scoring.exact_match": lambda t: scoring.exact_match(t, ["paris"]),
    "scoring.f1_score": lambda t: scoring.f1_score(t, ["paris"]),
    "scoring.format_score": scoring.format_score,
    "scoring.retrieval_hit": lambda t: scoring.retrieval_hit(t, ["paris"]),
    "scoring.parse_judge_verdict": scoring.parse_judge_verdict,
    "viewer.blocks": turns.blocks,
    "viewer.highlight": lambda t: turns.highlight(t, ["paris", "search"]),
}
FLOODS = ["<search>", "<think>", "<answer>", "<information>", "<answer></search>", "<search><answer>x",
          "<|im_start|>assistant ", "<information>Doc 1(Title: (", "a the an ", "( )"]
SMALL = 4 * 1024
RATIO = 4


def _cpu_cost(parse: Callable[[str], object], text: str, repeats: int) -> float:
    """The least thread CPU time of two runs of `repeats` calls."""
    best = float("inf")
    for _ in range(2):
        t0 = time.thread_time()
        for _ in range(repeats):
            parse(text)
        best = min(best, time.thread_time() - t0)
    return best


def _repeats(parse: Callable[[str], object], text: str) -> int:
    """Calls of `parse(text)` that take at least 5 ms of CPU (so the clock's grain does not matter)."""
    n = 1
    while n < 4096:
        t0 = time.thread_time()
        for _ in range(n):
            parse(text)
        if time.thread_time() - t0 >= 0.005:
            return n
        n *= 2
    return n


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_parser_is_linear_on_floods(name):
    parse = PARSERS[name]
    for flood in FLOODS:
        small = (flood * (SMALL // len(flood) + 1))[:SMALL]
        large = (flood * (SMALL * RATIO // len(flood) + 1))[:SMALL * RATIO]
        n = _repeats(parse, small)
        ratio = _cpu_cost(parse, large, n) / max(_cpu_cost(parse, small, n), 1e-9)
        assert ratio < 2 * RATIO, f"{name} on a {flood!r} flood: {RATIO}x the text cost {ratio:.1f}x the CPU"
