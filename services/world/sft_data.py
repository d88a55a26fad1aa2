"""Warm-start training data: Search-R1 traces sampled from fresh worlds, tokenised with the loss mask,
and the copy drills of copy pre-training. Pure data building: no optimiser, no model.

Loss mask (the same invariant the RL trajectories obey): labels are the token ids on policy segments
and −100 on the prompt and on every environment token (observations). Each segment is tokenised on its
own, as in a rollout, where the observation ids are appended to the sampled ids.

Every `refresh_steps` a freshly generated world supplies new unknown entities (same known ones), so
memorising passages cannot work and the model must copy from the observation; batches mix all trace
kinds and lengths (length-sorted batches made the search-or-answer choice swing globally).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from searchr1.core.protocol import render_prompt
from searchr1.world.generator import Entity, Question, generate_world
from searchr1.world.settings import GeneratorSettings, WarmstartSettings
from searchr1.world.traces import Trace, TraceRates, make_trace

IGNORE = -100
"""Label of a token the loss ignores (prompt, environment, padding)."""


def encode_trace(tokenizer, trace: Trace) -> tuple[list[int], list[int]]:
    """(input_ids, labels): the rendered prompt then each segment tokenised separately; labels copy the
    ids on policy segments and are −100 on the prompt and on environment segments."""
    prompt = render_prompt(trace.question, tokenizer)
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    labels = [IGNORE] * len(ids)
    for seg in trace.segments:
        seg_ids = list(tokenizer(seg.text, add_special_tokens=False)["input_ids"])
        ids.extend(seg_ids)
        labels.extend(seg_ids if seg.policy else [IGNORE] * len(seg_ids))
    return ids, labels


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """Right-padded tensors (input_ids, attention_mask, labels); padding is masked and ignored."""
    import torch

    n = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), n), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(examples), n), dtype=torch.long)
    for i, (ids, lab) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention[i, : len(ids)] = 1
    return input_ids, attention, labels


@dataclass
class TraceSampler:
    """Samples mixed traces; a fresh world (new unknown entities, the target's known ones) every
    `refresh_steps` steps. Deterministic for a given seed."""

    generator: GeneratorSettings
    known: list[Entity]
    reserved_names: list[str]
    ws: WarmstartSettings
    rng: random.Random = field(init=False)
    epoch: int = field(default=-1, init=False)
    kinds: Counter = field(default_factory=Counter, init=False)

    def __post_init__(self) -> None:
        from searchr1.world.search import CorpusSearch

        self._CorpusSearch = CorpusSearch
        self.rng = random.Random(f"warmstart-{self.ws.seed}")
        self.rates = TraceRates.from_settings(self.ws)

    def _refresh(self, epoch: int) -> None:
        # seeds far from any world a user builds by hand; names of the target world are reserved
        seed = 1_000_000_007 + 7919 * self.ws.seed + epoch
        self.world = generate_world(self.generator, seed, known=self.known, reserved_names=self.reserved_names)
        self.search = self._CorpusSearch(self.world.corpus_cache()).search
        pools: dict[tuple[bool, int], list[Question]] = {}
        for q in self.world.questions():
            pools.setdefault((q.known, len(q.hops)), []).append(q)
        self.pools = pools
        self.epoch = epoch

    def batch(self, step: int, size: int) -> list[Trace]:
        epoch = step // self.ws.refresh_steps
        if epoch != self.epoch:
            self._refresh(epoch)
        out = []
        for _ in range(size):
            known = self.rng.random() < self.ws.known_fraction
            hops = 2 if self.rng.random() < self.ws.two_hop_fraction else 1
            pool = self.pools.get((known, hops)) or self.pools[(known, 1)]
            trace = make_trace(self.world, self.rng.choice(pool), self.search, self.rates, self.rng)
            self.kinds[trace.kind] += 1
            out.append(trace)
        return out


def copy_example(rng: random.Random, vocab_size: int, first_id: int = 3) -> tuple[list[int], list[int]]:
    """One copy drill: random tokens `prefix + seq + filler + seq` (prefix and filler 0–30 tokens, seq 8–40,
    ids in [first_id, vocab_size)); labels train only the second `seq` after its first token (the part
    predictable by looking back at the first occurrence). The lengths vary, so no fixed look-back
    distance solves it: only content-based copying (induction) does."""
    def draw(n: int) -> list[int]:
        return [rng.randrange(first_id, vocab_size) for _ in range(n)]

    prefix, seq, filler = draw(rng.randint(0, 30)), draw(rng.randint(8, 40)), draw(rng.randint(0, 30))
    ids = prefix + seq + filler + seq
    labels = [IGNORE] * (len(ids) - len(seq) + 1) + seq[1:]
    return ids, labels
