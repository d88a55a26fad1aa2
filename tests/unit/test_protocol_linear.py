"""Linear-time tag extraction (`searchr1.core._tag_scan`): the same matches as the non-greedy regular
expressions the protocol used, on hand-written and random texts, and a bounded number of characters
scanned per character of input on floods that cost a regular expression n² steps (counted, not timed)."""

from __future__ import annotations

import random
import re

import pytest

from searchr1.core import protocol
from searchr1.core._tag_scan import contents, iter_blocks

TAGS = ("think", "search", "information", "answer")


def _regex_blocks(text: str, tags) -> list[tuple[str, str]]:
    pattern = re.compile(rf"<({'|'.join(tags)})>(.*?)</\1>", re.DOTALL)
    return [(m.group(1), m.group(2)) for m in pattern.finditer(text)]


@pytest.mark.parametrize("text", [
    "", "<answer>x</answer>", "<answer><answer>x</answer>", "<answer>a</answer> <answer> b </answer>",
    "<search>q</answer></search><answer>A</answer>", "<search>no close <answer>yes</answer>",
    "</answer><answer>", "<think>t</think><search>q</search><information>d</information><answer>a</answer>",
    "<answer>a<search>b</answer>c</search>",
])
def test_same_matches_as_the_regex(text):
    for tags in (TAGS, ("search", "answer"), ("answer",)):
        assert [(b.tag, b.content) for b in iter_blocks(text, tags)] == _regex_blocks(text, tags)


def test_same_matches_on_random_texts():
    rng = random.Random(0)
    pieces = [f"<{p}{t}>" for t in TAGS for p in ("", "/")] + ["x", " ", "\n", "<", ">", "ans"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        for tags in (TAGS, ("search", "answer"), ("answer",)):
            assert [(b.tag, b.content) for b in iter_blocks(text, tags)] == _regex_blocks(text, tags), text


class Counting(str):
    """A str that counts the characters its find/rfind calls pass over."""

    scanned = 0

    def find(self, sub, start=0, *args):  # type: ignore[override]
        at = str.find(self, sub, start, *args)
        Counting.scanned += (len(self) if at < 0 else at + len(sub)) - start
        return at

    def rfind(self, sub, *args):  # type: ignore[override]
        Counting.scanned += len(self)
        return str.rfind(self, sub, *args)


@pytest.mark.parametrize("flood", ["<answer>", "<answer></search>", "<search><answer>x", "<answer>x</answer>"])
def test_scanning_is_linear_in_the_text(flood):
    """Characters scanned per input character stay bounded as the text grows 32-fold (32 KB to 1 MB)."""
    per_char = []
    for n in (32 * 1024, 1024 * 1024):
        text = Counting((flood * (n // len(flood) + 1))[:n])
        Counting.scanned = 0
        protocol.extract_answer(text)
        protocol.parse_action(text)
        protocol.tag_segments(text)
        protocol.count_searches(text)
        per_char.append(Counting.scanned / n)
    assert per_char[0] > 0  # the scanner did the work
    assert per_char[1] <= per_char[0] * 1.1 and per_char[1] < 40


def test_contents_strips_nothing():
    assert contents(" <answer> a </answer>", "answer") == [" a "]
