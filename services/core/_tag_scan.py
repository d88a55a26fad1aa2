"""Linear-time extraction of `<tag>…</tag>` blocks, for the protocol's parsers (`searchr1.core.protocol`).

The same matches as the regular expression `<(t1|t2|…)>(.*?)</\\1>` (DOTALL) applied with `finditer`, in
time linear in the text: a regular expression engine retries the non-greedy body from every opening tag,
so a text of n opening tags without a closing one costs it n² steps (a 1 MB `<answer>` flood: minutes on
the event loop). Here each opening tag is accepted only when its closing tag occurs after it (one `rfind`
per tag name), the cursor for each tag name only moves forward, and every character is looked at a
bounded number of times.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Block:
    """One `<tag>content</tag>` block: the tag name, the block's span and its content (unstripped)."""

    tag: str
    start: int
    end: int
    content: str


def iter_blocks(text: str, tags: Sequence[str]) -> Iterator[Block]:
    """The non-overlapping blocks of any of `tags` in `text`, left to right (see the module docstring)."""
    opens = {t: f"<{t}>" for t in tags}
    closes = {t: f"</{t}>" for t in tags}
    last_close = {t: text.rfind(closes[t]) for t in tags}
    live = [t for t in tags if last_close[t] >= 0]
    next_open = {t: text.find(opens[t]) for t in live}
    pos = 0
    while live:
        for t in live:  # each tag's next opening at or after pos
            if 0 <= next_open[t] < pos:
                next_open[t] = text.find(opens[t], pos)
        live = [t for t in live if next_open[t] >= 0]
        if not live:
            return
        tag = min(live, key=lambda t: next_open[t])
        start = next_open[tag]
        body = start + len(opens[tag])
        if last_close[tag] < body:  # no closing tag after this opening: none after any later one either
            live.remove(tag)
            continue
        close = text.find(closes[tag], body)
        end = close + len(closes[tag])
        yield Block(tag, start, end, text[body:close])
        pos = end


def contents(text: str, tag: str) -> list[str]:
    """The content of every `<tag>…</tag>` block (like `re.findall(r"<tag>(.*?)</tag>", text, re.DOTALL)`)."""
    return [b.content for b in iter_blocks(text, (tag,))]
