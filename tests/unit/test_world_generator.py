"""The tiny world's generator: deterministic, closed known group, answerable questions, held-out split."""

from __future__ import annotations

import pytest

from searchr1.world.generator import (
    COMPANY_SUFFIXES,
    QUESTION_TYPES,
    RELATIONS,
    STOP_WORDS,
    World,
    generate_world,
    name_lexicon,
    split_questions,
)
from searchr1.world.settings import GeneratorSettings, ModelSettings, WorldSettings

GEN = GeneratorSettings(people=30, cities=8, companies=6, countries=3, known_people=4, known_cities=2,
                        known_companies=2, known_countries=1)


def test_same_seed_same_world_other_seed_other_world():
    a, b, c = generate_world(GEN, 5), generate_world(GEN, 5), generate_world(GEN, 6)
    assert a.corpus() == b.corpus()
    assert [q.text for q in a.questions()] == [q.text for q in b.questions()]
    assert a.corpus() != c.corpus()


def test_counts_and_unique_names():
    w = generate_world(GEN, 1)
    kinds = [e.kind for e in w.entities]
    assert kinds.count("person") == 30 and kinds.count("city") == 8
    assert kinds.count("company") == 6 and kinds.count("country") == 3
    assert sum(e.known for e in w.entities) == 4 + 2 + 2 + 1
    names = [e.name for e in w.entities]
    assert len(set(names)) == len(names)


def test_known_and_unknown_groups_are_closed():
    w = generate_world(GEN, 2)
    for e in w.entities:
        for attr, v in e.attrs.items():
            if attr in RELATIONS:
                assert w.by_id[v].known == e.known, (e.id, attr)


def test_every_hop_fact_is_in_its_gold_passage():
    w = generate_world(GEN, 3)
    corpus = w.corpus()
    assert all(c.startswith('"') and "\n" in c for c in corpus)
    seen = set()
    for q in w.questions():
        seen.add(q.question_type)
        for hop in q.hops:
            passage = corpus[w.doc_of[hop.subject]]
            subject = w.by_id[hop.subject]
            assert passage.split("\n")[0] == f'"{subject.name}"'
            assert w.fact_sentence(subject, hop.attr) in passage
            assert hop.value in passage
        assert q.answers == (q.hops[-1].value,)
        assert len(q.hops) == len(QUESTION_TYPES[q.question_type][1])
    assert seen == set(QUESTION_TYPES)


def test_two_hop_chain_follows_relations():
    w = generate_world(GEN, 4)
    person = next(e for e in w.entities if e.kind == "person" and not e.known)
    q = w.question("person_birth_country", person)
    city = w.by_id[person.attrs["birth_city"]]
    assert q.hops[0].value == city.name and q.hops[1].subject == city.id
    assert q.answers == (w.by_id[city.attrs["country"]].name,)
    assert q.data_source == "world_unknown_two_hop"
    assert q.text == f"In which country was {person.name} born?"


def test_split_holds_out_subjects_and_alternates_known():
    w = generate_world(GEN, 7)
    train, test = split_questions(w, 0.25)
    assert len(train) + len(test) == len(w.questions())
    unknown_train = {q.subject for q in train if not q.known}
    unknown_test = {q.subject for q in test if not q.known}
    assert unknown_train and unknown_test and not unknown_train & unknown_test
    known = w.questions(known=True)
    assert sum(q.known for q in test) == len(known) // 2
    again = split_questions(generate_world(GEN, 7), 0.25)
    assert [q.text for q in again[0]] == [q.text for q in train]


def test_fresh_world_keeps_known_entities_and_avoids_reserved_names():
    target = generate_world(GEN, 0)
    reserved = [e.name for e in target.entities if not e.known]
    fresh = generate_world(GEN, 99, known=target.known_entities(), reserved_names=reserved)
    assert [e.to_json() for e in fresh.known_entities()] == [e.to_json() for e in target.known_entities()]
    known_words = {w for e in target.known_entities() for w in e.name.split()} - set(COMPANY_SUFFIXES)
    for e in fresh.entities:
        if not e.known:
            assert e.name not in reserved and not set(e.name.split()) & known_words


def test_names_are_lexicon_words_unique_within_a_world():
    lexicon = name_lexicon(GEN.name_words)
    assert len(lexicon) == len(set(lexicon)) == GEN.name_words and name_lexicon(GEN.name_words) == lexicon
    assert all(3 <= len(w) <= 9 and w[0].isupper() for w in lexicon)
    # never an English word of the fixed texts, nor the start of one or of a company suffix
    assert not any(f.lower().startswith(w.lower()) for w in lexicon for f in (*STOP_WORDS, *COMPANY_SUFFIXES))
    w = generate_world(GEN, 11)
    words = [x for e in w.entities for x in e.name.split() if x not in COMPANY_SUFFIXES]
    assert set(words) <= set(lexicon) and len(words) == len(set(words))
    # the target world and a warm-start world share the lexicon, not the combinations
    other = generate_world(GEN, 12)
    assert {x for e in other.entities for x in e.name.split()} & set(words)


def test_lexicon_must_fit_the_world():
    with pytest.raises(ValueError, match="name_words"):
        GeneratorSettings(people=400, name_words=640)


def test_world_json_round_trip():
    w = generate_world(GEN, 8)
    back = World.from_json(w.to_json())
    assert back.corpus() == w.corpus()
    assert [q.text for q in back.questions()] == [q.text for q in w.questions()]


def test_settings_bounds():
    with pytest.raises(ValueError):
        GeneratorSettings(people=4, known_people=4)
    with pytest.raises(ValueError):
        ModelSettings(hidden_size=64, num_heads=4)  # head_dim 16: vLLM's CPU attention rejects it
    assert ModelSettings().head_dim == 32
    s = WorldSettings(seed=3)
    assert s.warmstart.threads >= 1 and s.tokenizer.vocab_size == 1024


def test_settings_from_env(monkeypatch):
    from searchr1.core.settings import load_settings

    monkeypatch.setenv("WORLD_WARMSTART__STEPS", "17")
    monkeypatch.setenv("WORLD_GENERATOR__PEOPLE", "40")
    s = load_settings(WorldSettings)
    assert s.warmstart.steps == 17 and s.generator.people == 40


def test_configs_world_default_spells_out_the_defaults():
    from pathlib import Path

    from searchr1.core.settings import load_settings

    path = Path(__file__).resolve().parents[2] / "configs" / "world-default.toml"
    assert load_settings(WorldSettings, path) == WorldSettings()
