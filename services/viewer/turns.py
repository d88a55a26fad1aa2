"""A trajectory cut into what the page shows: protocol blocks (think, search, information, answer, free
text), each marked as the policy's tokens or the environment's, with the loss mask's token counts and
mean log-probs attached; retrieved passages split into documents; gold answers highlighted. Pure."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from markupsafe import Markup

from searchr1.core.protocol import INVALID_ACTION_MESSAGE, tag_segments

_DOC_RE = re.compile(r"^Doc (\d+)\(Title: (.*?)\) ?(.*)$", re.DOTALL)


@dataclass
class Block:
    """One protocol block of the response."""

    kind: str  # think | search | information | answer | text | invalid
    text: str
    env: bool
    tokens: int | None = None  # on the first block of a stretch: the stretch's tokens (its loss-mask run)
    logprob_mean: float | None = None  # likewise: the run's mean behaviour log-prob (policy runs)
    docs: list[tuple[str, str, str]] = field(default_factory=list)  # (number, title, text)


@dataclass(frozen=True)
class Run:
    """A maximal run of equal loss-mask values."""

    masked_in: bool  # loss mask 1: the policy's tokens
    start: int
    length: int


def mask_runs(mask: Sequence[int]) -> list[Run]:
    """`[1, 1, 0, 1]` → runs (in, 0, 2), (env, 2, 1), (in, 3, 1)."""
    runs: list[Run] = []
    for i, m in enumerate(mask):
        if runs and runs[-1].masked_in == bool(m):
            last = runs[-1]
            runs[-1] = Run(last.masked_in, last.start, last.length + 1)
        else:
            runs.append(Run(bool(m), i, 1))
    return runs


def _docs(text: str) -> list[tuple[str, str, str]]:
    inner = text.removeprefix("<information>").removesuffix("</information>").strip()
    docs = []
    for line in inner.split("\n"):
        m = _DOC_RE.match(line.strip())
        if m:
            docs.append((m.group(1), m.group(2), m.group(3)))
        elif line.strip() and docs:
            n, title, body = docs[-1]
            docs[-1] = (n, title, body + "\n" + line)
    return docs


def blocks(text: str) -> list[Block]:
    """The response's blocks in order; `<information>` blocks and Search-R1's invalid-action message (cut out
    first: its own text names the tags) are environment."""
    out = []
    pieces = text.split(INVALID_ACTION_MESSAGE)
    cut = _cut_message(pieces[-1])
    partial = pieces[-1][cut:] if cut is not None else ""  # a response cut at its token limit inside the message
    pieces[-1] = pieces[-1][:cut] if cut is not None else pieces[-1]
    for i, piece in enumerate(pieces):
        for seg, tag in tag_segments(piece):
            if tag is None and not seg.strip():
                continue
            b = Block(kind=tag or "text", text=seg, env=tag == "information")
            if tag == "information":
                b.docs = _docs(seg)
            out.append(b)
        if i < len(pieces) - 1:
            out.append(Block(kind="invalid", text=INVALID_ACTION_MESSAGE, env=True))
    if partial:
        out.append(Block(kind="invalid", text=partial, env=True))
    return out


def _cut_message(tail: str) -> int | None:
    """Where `tail` ends in a start of the invalid-action message (its first line at least), if it does."""
    head = INVALID_ACTION_MESSAGE.split(".")[0]  # "\nMy previous action is invalid"
    at = tail.rfind(head)
    return at if at >= 0 and INVALID_ACTION_MESSAGE.startswith(tail[at:]) else None


def attach_mask(bs: list[Block], mask: Sequence[int], logprobs: Sequence[float]) -> bool:
    """Give the first block of each maximal stretch of policy (or environment) blocks the token count and
    mean log-prob of the matching loss-mask run. False (nothing attached) when the text's stretches and the mask's runs
    do not pair up."""
    stretches: list[list[Block]] = []
    for b in bs:
        if stretches and stretches[-1][0].env == b.env:
            stretches[-1].append(b)
        else:
            stretches.append([b])
    runs = mask_runs(mask)
    if len(runs) != len(stretches) or any(r.masked_in == s[0].env for r, s in zip(runs, stretches)):
        return False
    for run, stretch in zip(runs, stretches):
        lp = [x for x in logprobs[run.start:run.start + run.length] if math.isfinite(x)]
        stretch[0].tokens = run.length
        stretch[0].logprob_mean = sum(lp) / len(lp) if (lp and run.masked_in) else None
    return True


def highlight(text: str, answers: Sequence[str]) -> Markup:
    """`text` escaped, with every case-insensitive occurrence of a gold answer in `<mark class="gold">`."""
    words = sorted({a.strip() for a in answers if a and a.strip()}, key=len, reverse=True)
    if not words:
        return Markup(escape(text))
    pattern = re.compile("|".join(re.escape(w) for w in words), re.IGNORECASE)
    out, pos = [], 0
    for m in pattern.finditer(text):
        out.append(escape(text[pos:m.start()]))
        out.append(f'<mark class="gold">{escape(m.group(0))}</mark>')
        pos = m.end()
    out.append(escape(text[pos:]))
    return Markup("".join(out))


def token_cells(ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float],
                pieces: Sequence[str] | None = None) -> list[dict]:
    """One cell per response token: its text (decoded piece, newlines and tabs as ↵ and →; or the id),
    whether it is the policy's, and
    a shade in [0, 1] from its log-prob (0 = certain, 1 = log-prob ≤ -10)."""
    cells = []
    for i, tok in enumerate(ids):
        lp = logprobs[i] if i < len(logprobs) else 0.0
        own = bool(mask[i]) if i < len(mask) else False
        shade = min(1.0, max(0.0, -lp / 10.0)) if own and math.isfinite(lp) else 0.0
        text = pieces[i].replace("\n", "↵").replace("\t", "→") if pieces is not None else str(tok)
        cells.append({"text": text, "id": tok, "own": own,
                      "logprob": lp, "shade": round(shade, 3)})
    return cells
