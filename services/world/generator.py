"""The tiny world's knowledge base: fictional entities with attributes and relations, their passages
(a wiki-18 style corpus) and questions with gold answers. Pure Python, deterministic: the same seed and
settings give the same world, byte for byte, on any machine (one `random.Random`, no set or dict-order
dependence, no hashing of strings).

Kinds: countries (capital), cities (country, founding year), people (birth city, birth year,
occupation, employer), companies (headquarters, founder, industry, founding year). Names are built from
words of a fixed lexicon of syllable words (`names.name_lexicon`), so no real model knows them, and each word
is one token of the world's tokenizer. A small closed set of entities is *known*: their relations point
only to other known entities, and the warm start teaches their facts by heart, so questions about them
need no search. Unknown entities relate only to unknown entities, so an unknown single-hop question
needs one search and an unknown two-hop question two.

Each passage is the entity's fact sentences (`fact_sentence`) in a seeded order; a trace's final
`<think>` restates exactly one of them, so reading is copying the value out of the passage.

Not here: names (`names.py`), files (`build.py`), tokens (`tokenizer.py`), traces (`traces.py`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from searchr1.world.names import (  # noqa: F401  (re-exported: the world's name vocabulary)
    COMPANY_SUFFIXES,
    STOP_WORDS,
    Names,
    name_lexicon,
)
from searchr1.world.settings import GeneratorSettings

OCCUPATIONS = ("painter", "engineer", "chemist", "sculptor", "architect", "botanist", "pilot", "composer",
               "surgeon", "cartographer", "weaver", "astronomer", "glassblower", "lawyer")
INDUSTRIES = ("shipping", "mining", "textile", "software", "glassware", "banking", "farming", "printing",
              "aviation", "brewing", "timber", "salt")

# Question types: name -> (subject kind, path of attributes to follow). One attribute = single hop.
QUESTION_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "person_birth_city": ("person", ("birth_city",)),
    "person_birth_year": ("person", ("birth_year",)),
    "person_occupation": ("person", ("occupation",)),
    "person_employer": ("person", ("employer",)),
    "city_country": ("city", ("country",)),
    "city_founded": ("city", ("founded",)),
    "company_headquarters": ("company", ("headquarters",)),
    "company_founder": ("company", ("founder",)),
    "company_industry": ("company", ("industry",)),
    "person_birth_country": ("person", ("birth_city", "country")),
    "person_employer_headquarters": ("person", ("employer", "headquarters")),
    "company_founder_birth_city": ("company", ("founder", "birth_city")),
    "company_headquarters_country": ("company", ("headquarters", "country")),
}

_QUESTION_TEMPLATES: dict[str, str] = {
    "person_birth_city": "In which city was {0} born?",
    "person_birth_year": "In which year was {0} born?",
    "person_occupation": "What is the occupation of {0}?",
    "person_employer": "Which company does {0} work for?",
    "city_country": "In which country is {0}?",
    "city_founded": "In which year was {0} founded?",
    "company_headquarters": "In which city is {0} headquartered?",
    "company_founder": "Who founded {0}?",
    "company_industry": "Which industry is {0} in?",
    "person_birth_country": "In which country was {0} born?",
    "person_employer_headquarters": "In which city is the company that {0} works for headquartered?",
    "company_founder_birth_city": "In which city was the founder of {0} born?",
    "company_headquarters_country": "In which country is {0} headquartered?",
}

_NEED_PHRASES: dict[str, str] = {
    "birth_city": "the city where {0} was born",
    "birth_year": "the year {0} was born",
    "occupation": "the occupation of {0}",
    "employer": "the company {0} works for",
    "country": "the country {0} is in",
    "founded": "the year {0} was founded",
    "headquarters": "where {0} is headquartered",
    "founder": "who founded {0}",
    "industry": "the industry of {0}",
    "capital": "the capital of {0}",
}

_QUERY_WORDS: dict[str, str] = {
    "birth_city": "born", "birth_year": "born year", "occupation": "occupation", "employer": "works for",
    "country": "country", "founded": "founded", "headquarters": "headquarters", "founder": "founded by",
    "industry": "industry", "capital": "capital",
}

# Attributes whose value is another entity's id (the rest are plain values).
RELATIONS = frozenset({"birth_city", "employer", "country", "headquarters", "founder", "capital"})


@dataclass(frozen=True, slots=True)
class Entity:
    """One fictional entity. `attrs` maps attribute → value (an entity id for relations, else a
    string or an int year)."""

    id: str
    kind: str
    name: str
    known: bool
    attrs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "name": self.name, "known": self.known, "attrs": self.attrs}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Entity:
        return Entity(d["id"], d["kind"], d["name"], bool(d["known"]), dict(d["attrs"]))


@dataclass(frozen=True, slots=True)
class Hop:
    """One step of a question: the subject entity, the attribute asked, and the value (display text)."""

    subject: str
    attr: str
    value: str


@dataclass(frozen=True, slots=True)
class Question:
    """A question with its gold answers and the chain of facts that answers it."""

    question_type: str
    subject: str
    text: str
    answers: tuple[str, ...]
    hops: tuple[Hop, ...]
    known: bool
    entity_kind: str

    @property
    def data_source(self) -> str:
        return f"world_{'known' if self.known else 'unknown'}_{'single' if len(self.hops) == 1 else 'two'}_hop"


class World:
    """Entities by id plus derived views (names, passages, questions). Build with `generate_world`."""

    def __init__(self, entities: list[Entity], seed: int):
        self.seed = seed
        self.entities = entities
        self.by_id = {e.id: e for e in entities}
        if len(self.by_id) != len(entities):
            raise ValueError("duplicate entity ids")
        names = [e.name for e in entities]
        if len(set(names)) != len(names):
            raise ValueError("duplicate entity names")
        self._order = list(range(len(entities)))
        random.Random(f"order-{seed}").shuffle(self._order)  # corpus row order, seeded
        self.doc_of = {entities[i].id: row for row, i in enumerate(self._order)}
        self.by_name = {e.name: e for e in entities}
        self._corpus: list[str] | None = None

    # --- facts --------------------------------------------------------------------------------------
    def value_text(self, entity: Entity, attr: str) -> str:
        v = entity.attrs[attr]
        return self.by_id[v].name if attr in RELATIONS else str(v)

    def fact_sentence(self, entity: Entity, attr: str, value: str | None = None) -> str:
        """The sentence stating one fact, as it appears in the passage (or with another value, for
        deliberately wrong restatements)."""
        v = self.value_text(entity, attr) if value is None else value
        n = entity.name
        return {
            "birth_city": f"{n} was born in {v}.",
            "birth_year": f"{n} was born in the year {v}.",
            "occupation": f"{n} works as {_article(v)} {v}.",
            "employer": f"{n} works for {v}.",
            "country": f"{n} is a city in {v}.",
            "founded": f"{n} was founded in the year {v}.",
            "headquarters": f"{n} is headquartered in {v}.",
            "founder": f"{n} was founded by {v}.",
            "industry": f"{n} is a company in the {v} industry.",
            "capital": f"The capital of {n} is {v}.",
        }[attr]

    def passage(self, entity: Entity) -> str:
        """wiki-18 `contents`: `"Title"` on the first line, then the fact sentences in a seeded order
        (a city's country sentence first, as its introduction)."""
        attrs = sorted(entity.attrs)
        random.Random(f"passage-{self.seed}-{entity.id}").shuffle(attrs)
        if "country" in attrs:
            attrs.remove("country")
            attrs.insert(0, "country")
        body = " ".join(self.fact_sentence(entity, a) for a in attrs)
        return f'"{entity.name}"\n{body}'

    def corpus(self) -> list[str]:
        """Passages in corpus order (row number = doc id)."""
        return [self.passage(self.entities[i]) for i in self._order]

    def corpus_cache(self) -> list[str]:
        """`corpus()`, computed once."""
        if self._corpus is None:
            self._corpus = self.corpus()
        return self._corpus

    def entity_at(self, row: int) -> Entity:
        """The entity whose passage is corpus row `row`."""
        return self.entities[self._order[row]]

    def need_phrase(self, entity: Entity, attr: str) -> str:
        return _NEED_PHRASES[attr].format(entity.name)

    @staticmethod
    def query_word(attr: str) -> str:
        return _QUERY_WORDS[attr]

    # --- questions ----------------------------------------------------------------------------------
    def question(self, qtype: str, subject: Entity) -> Question:
        kind, path = QUESTION_TYPES[qtype]
        if subject.kind != kind:
            raise ValueError(f"{qtype} needs a {kind}, got {subject.kind}")
        hops = []
        cur = subject
        for attr in path:
            value = self.value_text(cur, attr)
            hops.append(Hop(cur.id, attr, value))
            if attr in RELATIONS:
                cur = self.by_id[cur.attrs[attr]]
        return Question(qtype, subject.id, _QUESTION_TEMPLATES[qtype].format(subject.name), (hops[-1].value,),
                        tuple(hops), subject.known, kind)

    def questions(self, known: bool | None = None) -> list[Question]:
        """Every question the world supports, in a fixed order (entity order, then question type)."""
        out = []
        for e in self.entities:
            if known is not None and e.known != known:
                continue
            for qtype, (kind, _) in QUESTION_TYPES.items():
                if kind == e.kind:
                    out.append(self.question(qtype, e))
        return out

    def known_entities(self) -> list[Entity]:
        return [e for e in self.entities if e.known]

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "entities": [e.to_json() for e in self.entities]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> World:
        return World([Entity.from_json(e) for e in d["entities"]], int(d["seed"]))


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _make_group(rng: random.Random, names: Names, counts: dict[str, int], known: bool,
                prefix: str) -> list[Entity]:
    """A closed group of entities whose relations stay inside the group."""
    countries = [Entity(f"{prefix}country-{i:04d}", "country", names.country(), known, {})
                 for i in range(counts["country"])]
    cities = []
    for i in range(counts["city"]):
        # every country gets at least one city, the rest are spread at random
        country = countries[i] if i < len(countries) else rng.choice(countries)
        cities.append(Entity(f"{prefix}city-{i:04d}", "city", names.city(), known,
                             {"country": country.id, "founded": rng.randint(900, 1850)}))
    for c in countries:
        mine = [city for city in cities if city.attrs["country"] == c.id]
        c.attrs["capital"] = rng.choice(mine).id
    people = []
    for i in range(counts["person"]):
        people.append(Entity(f"{prefix}person-{i:04d}", "person", names.person(), known, {
            "birth_city": rng.choice(cities).id,
            "birth_year": rng.randint(1780, 1995),
            "occupation": rng.choice(OCCUPATIONS),
        }))
    companies = []
    for i in range(counts["company"]):
        founder = rng.choice(people)
        companies.append(Entity(f"{prefix}company-{i:04d}", "company", names.company(), known, {
            "headquarters": rng.choice(cities).id,
            "founder": founder.id,
            "industry": rng.choice(INDUSTRIES),
            "founded": min(2020, founder.attrs["birth_year"] + rng.randint(20, 50)),
        }))
    for p in people:
        p.attrs["employer"] = rng.choice(companies).id
    return countries + cities + people + companies


def generate_known(settings: GeneratorSettings, seed: int) -> list[Entity]:
    """The known entities of the world with this seed (a closed group; ids prefixed `k-`)."""
    rng = random.Random(f"known-{seed}")
    counts = {"country": settings.known_countries, "city": settings.known_cities,
              "person": settings.known_people, "company": settings.known_companies}
    return _make_group(rng, Names(rng, name_lexicon(settings.name_words), [], []), counts, True, "k-")


def generate_world(settings: GeneratorSettings, seed: int, known: list[Entity] | None = None,
                   reserved_names: list[str] = ()) -> World:
    """A world: the known group (generated from `seed`, or the given one — the warm start passes the
    target world's known entities into each fresh world) plus a fresh unknown group from `seed` whose
    names avoid `reserved_names` (the warm start reserves the target world's names, so its unknown
    entities are never seen in training)."""
    known = generate_known(settings, seed) if known is None else [Entity.from_json(e.to_json()) for e in known]
    rng = random.Random(f"world-{seed}")
    known_names = [e.name for e in known]
    names = Names(rng, name_lexicon(settings.name_words), known_names + list(reserved_names), known_names)
    counts = {"country": settings.countries - settings.known_countries,
              "city": settings.cities - settings.known_cities,
              "person": settings.people - settings.known_people,
              "company": settings.companies - settings.known_companies}
    return World(known + _make_group(rng, names, counts, False, "u-"), seed)


def split_questions(world: World, test_fraction: float) -> tuple[list[Question], list[Question]]:
    """(train, test). Unknown questions are split by subject entity: a seeded `test_fraction` of the
    unknown people, cities and companies are held out with all their questions. Known questions
    alternate between the splits (the facts are memorised either way; the questions differ)."""
    rng = random.Random(f"split-{world.seed}")
    held_out: set[str] = set()
    for kind in ("person", "city", "company"):
        ids = [e.id for e in world.entities if e.kind == kind and not e.known]
        k = max(1, round(len(ids) * test_fraction))
        held_out.update(rng.sample(ids, k))
    train, test = [], []
    for q in world.questions(known=False):
        (test if q.subject in held_out else train).append(q)
    for i, q in enumerate(world.questions(known=True)):
        (test if i % 2 else train).append(q)
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test
