"""Synthetic warm-start traces in the exact Search-R1 protocol, as text segments marked *policy* (trained)
or *environment* (loss-masked). Pure: strings in, segments out; the search is passed in.

A trace answers one question. Policy turns are
`<think> … </think>\\n<search> q </search>` and, last, `<think> {restated fact} </think>\\n<answer> a
</answer><|im_end|>`; after each search the environment segment is exactly what the rollout worker
appends: `searchr1.core.protocol.observation_for(hits)`, with the hits a real BM25 search returns.

Kinds (chosen per trace by the warm-start settings), deliberately imperfect so RL has room:
- `search` — unknown entity: search each hop, restate the fact, answer (the good behaviour);
- `retry` — a noisy query (misspelt or truncated name) whose hits miss the gold passage, then a search
  with the right name;
- `wrong_copy` — searched, but the final restatement copies a distractor's value (wrong answer);
- `guess` — unknown entity answered from "memory" without searching (wrong answer);
- `memory` — known entity answered from memory (right answer, no search);
- `needless_search` — known entity searched anyway (right answer, wasted search).
A noisy query whose hits still contain the gold passage just continues (kind `search`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from searchr1.core.protocol import extract_answer, observation_for
from searchr1.world.chat import IM_END
from searchr1.world.generator import INDUSTRIES, OCCUPATIONS, RELATIONS, Entity, Question, World
from searchr1.world.settings import WarmstartSettings

PHRASES = (
    "<think> I need to find ",
    "The results do not mention ",
    ". I will search again. </think>\n<search> ",
    " </think>\n<answer> ",
    " </answer>" + IM_END,
    " </think>\n<search> ",
    " </search>",
)
"""Fixed trace phrases (also fed to the tokenizer's training text)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of the response: `policy=True` is sampled by the model (trained), else environment text."""

    text: str
    policy: bool


@dataclass(frozen=True, slots=True)
class Trace:
    question: str
    answers: tuple[str, ...]
    kind: str
    segments: tuple[Segment, ...]
    searches: int

    @property
    def response_text(self) -> str:
        return "".join(s.text for s in self.segments)

    @property
    def answer(self) -> str:
        """The trace's final answer (every trace ends with one)."""
        answer = extract_answer(self.response_text)
        if answer is None:
            raise ValueError("trace has no <answer>")
        return answer


@dataclass(frozen=True, slots=True)
class TraceRates:
    """Probabilities of the imperfect behaviours (see the module docstring): a frozen view of the
    `WarmstartSettings` fields of the same names (`from_settings`), which declare the defaults and their
    meaning."""

    p_guess: float
    p_needless_search: float
    p_noisy_query: float
    p_wrong_copy: float
    topk: int

    @classmethod
    def from_settings(cls, ws: WarmstartSettings) -> TraceRates:
        return cls(**{f: getattr(ws, f) for f in cls.__dataclass_fields__})


Search = Callable[[str, int], list[int]]


def _typo(word: str, rng: random.Random) -> str:
    if len(word) < 4:
        return word + rng.choice("aeiou")
    i = rng.randrange(1, len(word) - 1)
    if rng.random() < 0.5:
        return word[:i] + word[i + 1:]  # drop a letter
    return word[:i] + word[i + 1] + word[i] + word[i + 2:]  # swap two letters


def clean_query(world: World, subject: Entity, attr: str, rng: random.Random) -> str:
    return subject.name if rng.random() < 0.6 else f"{subject.name} {world.query_word(attr)}"


def noisy_query(world: World, subject: Entity, attr: str, rng: random.Random) -> str:
    words = subject.name.split()
    if len(words) > 1 and rng.random() < 0.4:
        words = words[:1] if rng.random() < 0.5 else words[-1:]  # a truncated name
    else:
        j = rng.randrange(len(words))
        words[j] = _typo(words[j], rng)
    return " ".join(words)


def _random_value(world: World, attr: str, exclude: str, rng: random.Random, pool: list[Entity]) -> str:
    """A plausible wrong value for `attr` (same type, different from `exclude`)."""
    for _ in range(50):
        if attr in RELATIONS:
            kind = {"birth_city": "city", "headquarters": "city", "capital": "city", "country": "country",
                    "employer": "company", "founder": "person"}[attr]
            cands = [e for e in pool if e.kind == kind] or [e for e in world.entities if e.kind == kind]
            v = rng.choice(cands).name
        elif attr == "occupation":
            v = rng.choice(OCCUPATIONS)
        elif attr == "industry":
            v = rng.choice(INDUSTRIES)
        else:  # years
            v = str(int(exclude) + rng.choice((-1, 1)) * rng.randint(1, 60)) if exclude.isdigit() else "1900"
        if v != exclude:
            return v
    return v


def _chain(world: World, q: Question, wrong: bool, rng: random.Random) -> tuple[list[str], str]:
    """Fact sentences along the question's hops and the final value; `wrong` swaps the first hop's
    value for a plausible wrong one (and follows the chain from there when it can)."""
    facts, cur, value = [], world.by_id[q.hops[0].subject], ""
    pool = [e for e in world.entities if e.known == q.known]
    for i, hop in enumerate(q.hops):
        value = world.value_text(cur, hop.attr)
        if wrong and i == 0:
            value = _random_value(world, hop.attr, value, rng, pool)
        facts.append(world.fact_sentence(cur, hop.attr, value))
        if i + 1 < len(q.hops):
            nxt = world.by_name.get(value)
            if nxt is None:
                break
            cur = nxt
    return facts, value


def make_trace(world: World, q: Question, search: Search, rates: TraceRates, rng: random.Random) -> Trace:
    """One trace for `q` in `world` (see the module docstring for the kinds)."""
    if q.known:
        if rng.random() >= rates.p_needless_search:
            facts, value = _chain(world, q, False, rng)
            return _memory_trace(q, facts, value, "memory")
        return _search_trace(world, q, search, rates, rng, "needless_search")
    if rng.random() < rates.p_guess:
        facts, value = _chain(world, q, True, rng)
        return _memory_trace(q, facts, value, "guess")
    return _search_trace(world, q, search, rates, rng, "search")


def _memory_trace(q: Question, facts: list[str], value: str, kind: str) -> Trace:
    text = f"<think> {' '.join(facts)} </think>\n<answer> {value} </answer>{IM_END}"
    return Trace(q.text, q.answers, kind, (Segment(text, True),), 0)


def _search_trace(world: World, q: Question, search: Search, rates: TraceRates, rng: random.Random,
                  kind: str) -> Trace:
    segments: list[Segment] = []
    searches = 0
    prev_fact = ""
    final_value = ""
    for i, hop in enumerate(q.hops):
        subject = world.by_id[hop.subject]
        gold = world.doc_of[subject.id]
        think = f"{prev_fact} I need to find {world.need_phrase(subject, hop.attr)}.".strip()
        noisy = rng.random() < rates.p_noisy_query
        query = noisy_query(world, subject, hop.attr, rng) if noisy else clean_query(world, subject, hop.attr, rng)
        segments.append(Segment(f"<think> {think} </think>\n<search> {query} </search>", True))
        hits = search(query, rates.topk)
        searches += 1
        segments.append(Segment(observation_for(world_contents(world, hits)), False))
        if gold not in hits:
            query = subject.name
            segments.append(Segment(
                f"<think> The results do not mention {subject.name}. I will search again. </think>\n"
                f"<search> {query} </search>", True))
            hits = search(query, rates.topk)
            searches += 1
            if gold not in hits:  # a clean name always finds its passage in practice; be safe
                hits = [gold] + [h for h in hits if h != gold][: rates.topk - 1]
            segments.append(Segment(observation_for(world_contents(world, hits)), False))
            if kind == "search":
                kind = "retry"
        value = world.value_text(subject, hop.attr)
        last = i + 1 == len(q.hops)
        if last and rng.random() < rates.p_wrong_copy:
            value = _wrong_copy_value(world, subject, hop.attr, hits, rng)
            kind = "wrong_copy"
        prev_fact = world.fact_sentence(subject, hop.attr, value)
        final_value = value
    segments.append(Segment(f"<think> {prev_fact} </think>\n<answer> {final_value} </answer>{IM_END}", True))
    return Trace(q.text, q.answers, kind, tuple(segments), searches)


def _wrong_copy_value(world: World, subject: Entity, attr: str, hits: list[int], rng: random.Random) -> str:
    """The value a distractor passage among the hits gives for the same attribute, else a random one."""
    right = world.value_text(subject, attr)
    for row in hits:
        e = world.entity_at(row)
        if e.id != subject.id and attr in e.attrs and world.value_text(e, attr) != right:
            return world.value_text(e, attr)
    return _random_value(world, attr, right, rng, [e for e in world.entities if e.known == subject.known])


def world_contents(world: World, rows: list[int]) -> list[str]:
    corpus = world.corpus_cache()
    return [corpus[r] for r in rows]
