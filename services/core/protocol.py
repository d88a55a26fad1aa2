"""The Search-R1 text protocol, defined once (docs/architecture.md, "Protocol"): the tags, prompt
template, stop strings, action parsing, observation formatting and the invalid-action message,
byte-compatible with Search-R1 (`scripts/data_process/nq_search.py` and
`search_r1/llm_agent/generation.py`); answer extraction and normalisation (`verl/utils/reward_score/
qa_em.py`); and the format grammar (`qa_em_format.is_valid_sequence`). Rollout, reward and the tiny
world all read and write the protocol through this module.

Pure functions on strings; no tokenizer, torch or vLLM is imported here (`render_prompt` takes any
object with `apply_chat_template`, e.g. a transformers tokenizer). What to *score* from these facts
(EM, F1, format rewards) is the reward service's business, not this module's.

Departures from Search-R1, on purpose:
- Search-R1 generates each turn to `max_tokens` and then cuts the text after the first `</search>` or
  `</answer>`; we stop generation at those strings instead (`STOP_STRINGS`), which wastes no tokens and
  keeps the sampled ids exact. The parsed action is the same in both cases.
- Two answer extractors: `searchr1_extract_solution` is Search-R1's (needs at least two matches in
  prompt + response, so an answer-less response extracts `Beijing` from the prompt's example);
  `extract_answer` reads the response alone (the last answer, None without one).
- `is_well_formed` runs Search-R1's grammar on the response alone, ignoring trailing end-of-turn
  markers of any chat template; `searchr1_is_valid_sequence` is Search-R1's check on the full text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from searchr1.core._tag_scan import contents, iter_blocks

SEARCH_R1_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
"""Search-R1's `make_prefix(template_type='base')` text, byte for byte (typo "as your want" included)."""

SEARCH_R1 = "search_r1"
"""The name of Search-R1's own prompt template (the default of `[rollout.agent] template`)."""
TEMPLATES: dict[str, str] = {SEARCH_R1: SEARCH_R1_TEMPLATE}
"""Named prompt templates; each has one `{question}` field."""

STOP_STRINGS: tuple[str, str] = ("</search>", "</answer>")
"""A turn ends at the first of these (kept in the output) or at EOS."""

INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
"""The environment text Search-R1 appends after a turn with no valid action."""

TAGS = ("think", "search", "information", "answer")
"""The protocol's tag names, in the order of a turn."""

TAG_TOKENS: tuple[str, ...] = tuple(f"<{p}{t}>" for t in TAGS for p in ("", "/"))
"""The eight tag strings, each opening tag followed by its closing one: `<think>`, `</think>`, … `</answer>`."""

DEFAULT_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<eos>",
                       "<end_of_turn>", "<|end|>")
"""End-of-turn / end-of-text markers of common chat templates, ignored at the end of a response."""

_ASSISTANT_RE = re.compile(r"<\|im_start\|>assistant\s*")
_TAG_ALTERNATION = "|".join(TAGS)
_TAG_SPLIT_RE = re.compile(rf"(</?(?:{_TAG_ALTERNATION})>)")
_TAG_RE = re.compile(rf"</?(?:{_TAG_ALTERNATION})>")
_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")


class ChatTokenizer(Protocol):
    chat_template: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def normalize_question(question: str) -> str:
    """Strip the question and give it a trailing `?` (as Search-R1's data preparation does)."""
    q = question.strip()
    if not q:
        raise ValueError("question is empty")
    return q if q.endswith("?") else q + "?"


def make_prompt(question: str, template: str = SEARCH_R1) -> str:
    """The user message for `question` under a named template (default: Search-R1's, byte for byte)."""
    try:
        tmpl = TEMPLATES[template]
    except KeyError:
        raise ValueError(f"unknown prompt template {template!r}; known: {sorted(TEMPLATES)}") from None
    return tmpl.format(question=normalize_question(question))


def render_prompt(question: str, tokenizer: ChatTokenizer | None = None, template: str = SEARCH_R1) -> str:
    """The full prompt text: the user message wrapped by the tokenizer's chat template
    (`add_generation_prompt=True`) when it has one, else the bare message (base models)."""
    content = make_prompt(question, template)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
    return content


@dataclass(frozen=True, slots=True)
class Action:
    """The action a turn took: `search` with a query, `answer` with the answer, or None (invalid)."""

    kind: Literal["search", "answer"] | None
    content: str = ""


def parse_action(turn_text: str) -> Action:
    """First `<search>…</search>` or `<answer>…</answer>` in the turn (DOTALL, non-greedy), content
    stripped; no match is an invalid action. An empty query is still a (valid) search, as in Search-R1."""
    m = next(iter_blocks(turn_text, ("search", "answer")), None)
    if m is None:
        return Action(None, "")
    return Action(m.tag, m.content.strip())  # type: ignore[arg-type]


def split_contents(contents: str) -> tuple[str, str]:
    """Split a wiki-18 `contents` field into (title, text): title is the first line."""
    title, _, text = contents.partition("\n")
    return title, text


def format_docs(docs: Iterable[str | Mapping[str, Any]]) -> str:
    """Search-R1's `_passages2string`: one `Doc {i}(Title: {title}) {text}` line per hit, each ending in
    a newline. A hit is a `contents` string or a mapping with `contents` (or `document.contents`)."""
    out = []
    for i, doc in enumerate(docs, start=1):
        if isinstance(doc, str):
            contents = doc
        elif "contents" in doc:
            contents = doc["contents"]
        else:
            contents = doc["document"]["contents"]
        title, text = split_contents(contents)
        out.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(out)


def format_observation(docs_text: str) -> str:
    """The environment text written after a search: `\\n\\n<information>{docs}</information>\\n\\n`,
    with the docs string stripped as Search-R1 does."""
    return f"\n\n<information>{docs_text.strip()}</information>\n\n"


def observation_for(docs: Sequence[str | Mapping[str, Any]]) -> str:
    """Observation text for a list of retrieved hits."""
    return format_observation(format_docs(docs))


# --------------------------------------------------------------------------------------------------
# Answers: normalisation and extraction
# --------------------------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """SQuAD normalisation as Search-R1 applies it: lower-case, drop every `string.punctuation`
    character (ASCII only: an en dash stays), replace whole-word a/an/the by a space, collapse
    whitespace. `"The  U.S.A., an Apple!"` → `"usa apple"`, `"1,000"` → `"1000"`."""
    text = text.lower().translate(_DROP_PUNCTUATION)  # same as dropping each char in string.punctuation
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def searchr1_extract_solution(solution_str: str) -> str | None:
    """Search-R1's `extract_solution`: all non-greedy `<answer>(.*?)</answer>` matches (DOTALL); fewer
    than two → None; otherwise the last one, stripped. On prompt + response the Search-R1 prompt holds
    two matches itself, so an answer-less response extracts `Beijing`."""
    matches = contents(solution_str, "answer")
    if len(matches) <= 1:
        return None
    return matches[-1].strip()


def extract_answer(response: str) -> str | None:
    """The response's answer: the last `<answer>…</answer>`, stripped; None when there is none."""
    matches = contents(response, "answer")
    return matches[-1].strip() if matches else None


def tag_segments(text: str) -> list[tuple[str, str | None]]:
    """`text` cut into consecutive `(segment, tag)` pairs: each whole `<tag>…</tag>` block of the protocol
    with its tag name, the text between blocks with None (for displaying a trajectory)."""
    out: list[tuple[str, str | None]] = []
    pos = 0
    for m in iter_blocks(text, TAGS):
        if m.start > pos:
            out.append((text[pos:m.start], None))
        out.append((text[m.start:m.end], m.tag))
        pos = m.end
    if pos < len(text):
        out.append((text[pos:], None))
    return out


def information_blocks(text: str) -> list[str]:
    """Contents of every `<information>…</information>` block, stripped."""
    return [m.strip() for m in contents(text, "information")]


def count_searches(response: str) -> int:
    """Number of complete `<search>…</search>` calls in a response."""
    return len(contents(response, "search"))


# --------------------------------------------------------------------------------------------------
# The format grammar (Search-R1's state machine)
# --------------------------------------------------------------------------------------------------

_TRANSITIONS = {
    ("<think>", "start"): "in_think",
    ("<think>", "information"): "in_think",
    ("</think>", "in_think"): "after_think",
    ("<search>", "after_think"): "in_search",
    ("</search>", "in_search"): "after_search",
    ("<information>", "after_search"): "in_information",
    ("</information>", "in_information"): "information",
    ("<answer>", "after_think"): "in_answer",
    ("</answer>", "in_answer"): "end",
}


def check_tag_sequence(content: str) -> tuple[bool, str]:
    """The tag grammar of Search-R1's `is_valid_sequence`, on the assistant text alone: balanced
    think/search/information/answer tags, only whitespace between tags, and the order
    think → (search → information → think)* → answer, with nothing but whitespace after `</answer>`.
    Returns (valid, reason)."""
    for tag in TAGS:
        opening = content.count(f"<{tag}>")
        closing = content.count(f"</{tag}>")
        if opening != closing:
            return False, f"Mismatch in {tag} tags: {opening} opening vs {closing} closing tags"
    state = "start"
    for part in _TAG_SPLIT_RE.split(content):
        if not part.strip():
            continue
        if _TAG_RE.match(part):
            nxt = _TRANSITIONS.get((part, state))
            if nxt is None:
                return False, f"Unexpected tag {part} in state {state}"
            state = nxt
        elif state in ("in_think", "in_search", "in_information", "in_answer"):
            continue
        elif state in ("start", "after_think", "after_search", "information"):
            return False, f"Unexpected content '{part.strip()}' between tags (state: {state})"
        else:
            return False, f"Unexpected content in state {state}"
    if state != "end":
        return False, f"Incomplete sequence, ended in state {state}"
    return True, "Valid sequence format"


def searchr1_is_valid_sequence(text: str) -> tuple[bool, str]:
    """Search-R1's `is_valid_sequence`: the grammar over the text after the first
    `<|im_start|>assistant` (and following whitespace); no marker → invalid."""
    m = _ASSISTANT_RE.search(text)
    if m is None:
        return False, "Missing assistant marker"
    return check_tag_sequence(text[m.end():])


def strip_end_markers(response: str, markers: Iterable[str] = DEFAULT_END_MARKERS) -> str:
    """Remove trailing whitespace and any of `markers` from the end of the response, repeatedly."""
    markers = tuple(m for m in markers if m)
    text = response.rstrip()
    changed = True
    while changed:
        changed = False
        for m in markers:
            if text.endswith(m):
                text = text[: -len(m)].rstrip()
                changed = True
    return text


def is_well_formed(response: str, end_markers: Iterable[str] = DEFAULT_END_MARKERS) -> bool:
    """The response alone follows Search-R1's tag grammar (`check_tag_sequence`), trailing end-of-turn
    markers of any chat template ignored."""
    valid, _ = check_tag_sequence(strip_end_markers(response, end_markers))
    return valid
