"""Checks of a warm-started model: a greedy multi-turn self-check with HF `generate` (format validity,
EM and searches per question, BM25 over the world's corpus answering each search), and a
teacher-forced reading probe (how much of a fact restated from the observation the model predicts, on
a world it never saw). Answers and format validity are read with `searchr1.core.protocol`: a response is
format-valid exactly when the reward's `format` scorer gives it 1.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchr1.core.protocol import (
    STOP_STRINGS,
    extract_answer,
    is_well_formed,
    normalize_answer,
    observation_for,
    parse_action,
    render_prompt,
)
from searchr1.world.generator import World, generate_world
from searchr1.world.settings import GeneratorSettings, WarmstartSettings
from searchr1.world.sft_data import encode_trace
from searchr1.world.traces import TraceRates, make_trace


def self_check(model, tokenizer, world: World, questions: Sequence[dict[str, Any]], *,
               topk: int, observation: str = "gold", max_searches: int = 3,
               max_turn_tokens: int = 64) -> dict[str, Any]:
    """Greedy multi-turn generation with HF `generate` on `questions` (world.json question records).
    Each search is answered with BM25 hits over the world's corpus; with `observation="gold"` the
    passage of the current hop is put first when BM25 missed it (so the check measures reading and
    format, not query quality). Returns EM, format-valid rate, searches per question, per data_source,
    and a few sample responses."""
    import torch

    from searchr1.world.search import CorpusSearch

    search = CorpusSearch(world.corpus_cache())
    stop_ids = [tokenizer.eos_token_id] + [tokenizer.convert_tokens_to_ids(t) for t in STOP_STRINGS]
    rows = []
    model.eval()
    for rec in questions:
        prompt = render_prompt(rec["question"], tokenizer)
        ctx = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        response, searches = "", 0
        for _ in range(max_searches + 1):
            with torch.no_grad():
                out = model.generate(ctx, attention_mask=torch.ones_like(ctx), max_new_tokens=max_turn_tokens,
                                     do_sample=False, eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
            new = out[0, ctx.shape[1]:]
            text = tokenizer.decode(new, skip_special_tokens=False)
            response += text
            ctx = out
            action = parse_action(text)
            if action.kind != "search" or searches >= max_searches:
                break
            hits = search.search(action.content, topk)
            if observation == "gold":
                gold = rec["gold_doc_ids"][min(searches, len(rec["gold_doc_ids"]) - 1)]
                if gold not in hits:
                    hits = [gold] + hits[: topk - 1]
            searches += 1
            obs = observation_for(search.contents(hits))
            response += obs
            obs_ids = tokenizer(obs, add_special_tokens=False)["input_ids"]
            ctx = torch.cat([ctx, torch.tensor([obs_ids])], dim=1)
        answer = extract_answer(response)
        em = answer is not None and normalize_answer(answer) in {normalize_answer(a) for a in rec["answers"]}
        rows.append({"data_source": rec.get("data_source", "world"), "em": float(em),
                     "valid": float(is_well_formed(response)), "searches": searches, "response": response})
    return summarize(rows)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def agg(rs: list[dict[str, Any]]) -> dict[str, float]:
        n = max(1, len(rs))
        return {"n": len(rs), "em": round(sum(r["em"] for r in rs) / n, 4),
                "format_valid": round(sum(r["valid"] for r in rs) / n, 4),
                "searches_per_question": round(sum(r["searches"] for r in rs) / n, 3)}

    by_source: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_source.setdefault(r["data_source"], []).append(r)
    return {**agg(rows), "by_data_source": {k: agg(v) for k, v in sorted(by_source.items())},
            "samples": [r["response"] for r in rows[:3]]}


READING_SEED = 3_000_000_019
"""Seed of the world the reading probe uses (never a warm-start or tokenizer world)."""


def value_token_positions(tokenizer, text: str, value: str) -> list[int]:
    """Indices of the tokens of `text` that overlap the last occurrence of `value` before `</think>`
    (the value restated in the final think)."""
    end = text.rindex("</think>")
    start = text.rindex(value, 0, end)
    stop = start + len(value)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < stop and b > start]


def reading_check(model, tokenizer, world: World, n: int = 64, *, topk: int, seed: int = 0) -> dict[str, Any]:
    """How well the model *reads*: on `n` clean search traces about unknown entities of `world` (a world
    the model never trained on), the share of the restated value's tokens (the fact copied out of the
    observation in the final think) that the model predicts greedily with the trace as context
    (teacher forcing), and the share of values it gets entirely right. One forward pass per trace: a
    cheap, direct measure of the skill search depends on (EM also needs the query and the answer)."""
    import torch

    from searchr1.world.search import CorpusSearch

    search = CorpusSearch(world.corpus_cache()).search
    rates = TraceRates(p_guess=0.0, p_needless_search=0.0, p_noisy_query=0.0, p_wrong_copy=0.0, topk=topk)
    rng = random.Random(f"reading-{seed}")
    pool = world.questions(known=False)
    right = total = whole = 0
    model.eval()
    for q in rng.sample(pool, min(n, len(pool))):
        trace = make_trace(world, q, search, rates, rng)
        ids, _ = encode_trace(tokenizer, trace)
        final = trace.segments[-1].text
        offset = len(ids) - len(tokenizer(final, add_special_tokens=False)["input_ids"])
        positions = [offset + i for i in value_token_positions(tokenizer, final, trace.answer)]
        with torch.no_grad():
            pred = model(torch.tensor([ids])).logits[0].argmax(-1)
        ok = [int(pred[p - 1]) == ids[p] for p in positions]
        right += sum(ok)
        total += len(ok)
        whole += all(ok)
    k = min(n, len(pool))
    return {"traces": k, "value_token_accuracy": round(right / max(1, total), 4),
            "value_exact": round(whole / max(1, k), 4), "topk": topk}


def reading_world(generator: GeneratorSettings, target: World) -> World:
    """The probe's world: the target's known entities, fresh unknown ones (target names reserved)."""
    return generate_world(generator, READING_SEED, known=target.known_entities(),
                          reserved_names=[e.name for e in target.entities if not e.known])


def run_check(model: str | Path, world: str | Path, n: int, observation: str, threads: int) -> dict[str, Any]:
    """`searchr1 world check`: load the model and the world, run `self_check` on the first `n` test
    questions with `threads` torch threads."""
    import torch
    from transformers import AutoModelForCausalLM

    from searchr1.world.build import load_world
    from searchr1.world.tokenizer import load_tokenizer

    torch.set_num_threads(threads)
    w, doc = load_world(world)
    tok = load_tokenizer(model)
    lm = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    topk = WarmstartSettings().topk  # the passages per search the warm start trained with
    questions = doc["questions"]["test"][:n]
    return self_check(lm, tok, w, questions, topk=topk, observation=observation)  # type: ignore[arg-type]
