"""A scripted search policy as a vLLM (v1) custom logits processor, for benchmarks and demos with a
*random* model: it forces the Search-R1 turn structure so an untrained policy actually searches.

Per turn it steers `<think> … </think>` then either `<search> … </search>` (while fewer than
`max_searches` observations are in the context, with probability `p_search`) or `<answer> … </answer>`.
Inside a segment the model samples freely among ordinary tokens (tags and special tokens masked); the
segment's closing tag has its logit set to `close_bias` (so segment lengths vary from sample to sample)
and is forced at `max_len`. After a closing `</search>`/`</answer>` the script starts over, so an engine
without stop strings (Search-R1's pattern) keeps generating until its token budget, as a real model
would.

Activation is per request: `SamplingParams.extra_args["searchr1_steer"]` holds the tag token ids and
the knobs (`steer_args(tokenizer, …)` builds it); requests without it are untouched. Load it with the
engine arg `logits_processors=["searchr1.rollout.tools.steering:SearchSteering"]`.

It is not part of the training path; the behaviour log-probs it produces (with
`logprobs_mode=processed_logprobs`) are those of the steered distribution.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from searchr1.core.protocol import TAG_TOKENS

KEY = "searchr1_steer"


def steer_args(tokenizer: Any, *, p_search: float = 0.7, max_searches: int = 4,
               close_bias: dict[str, float] | None = None, max_len: dict[str, int] | None = None,
               assistant_marker: str = "<|im_start|>", search_tokens: list[int] | None = None) -> dict[str, Any]:
    """The `extra_args` entry that turns steering on for a request (tags must be single tokens).
    `search_tokens`, when given, are the only ids a search query may use (e.g. word pieces, so queries
    are never empty or punctuation-only)."""
    ids = {}
    for tag in TAG_TOKENS:
        enc = tokenizer.encode(tag, add_special_tokens=False)
        if len(enc) != 1:
            raise ValueError(f"{tag!r} is not a single token in this tokenizer; steering needs it to be")
        ids[tag] = enc[0]
    specials = sorted(set(tokenizer.all_special_ids))
    marker = tokenizer.convert_tokens_to_ids(assistant_marker)
    return {KEY: {
        "tags": ids, "specials": specials, "marker": marker, "p_search": p_search, "max_searches": max_searches,
        "close_bias": {"think": 3.8, "search": 4.8, "answer": 5.5, **(close_bias or {})},
        "max_len": {"think": 40, "search": 12, "answer": 8, **(max_len or {})},
        "search_tokens": list(search_tokens or []),
    }}


class _Script:
    """Per-request state: which segment we are in is recomputed from the output ids each step."""

    def __init__(self, cfg: dict[str, Any], seed: int | None) -> None:
        t = cfg["tags"]
        self.t = t
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.banned = torch.tensor(sorted(set(t.values()) | set(cfg["specials"])), dtype=torch.long)
        self.close_of = {t["<think>"]: ("think", t["</think>"]), t["<search>"]: ("search", t["</search>"]),
                         t["<answer>"]: ("answer", t["</answer>"])}
        self.decisions: dict[int, int] = {}  # position of a `</think>` → the opening tag chosen after it
        allowed = cfg.get("search_tokens") or []
        self.search_only = torch.tensor(sorted(set(allowed)), dtype=torch.long) if allowed else None

    def _searches_done(self, prompt_ids: list[int]) -> int:
        marker = self.cfg["marker"]
        start = max((i for i, x in enumerate(prompt_ids) if x == marker), default=0)
        info = self.t["<information>"]
        return sum(1 for x in prompt_ids[start:] if x == info)

    def _choose(self, prompt_ids: list[int], extra_searches: int) -> int:
        done = self._searches_done(prompt_ids) + extra_searches
        if done < self.cfg["max_searches"] and self.rng.random() < self.cfg["p_search"]:
            return self.t["<search>"]
        return self.t["<answer>"]

    def _reset(self) -> None:
        self.pos, self.segment, self.close, self.seg_len, self.last, self.searches_here = 0, None, None, 0, None, 0

    def _advance(self, output_ids: list[int]) -> None:
        """Consume the ids sampled since the last call (incremental: O(1) per step)."""
        if not hasattr(self, "pos") or len(output_ids) < self.pos:  # first call, or the request restarted
            self._reset()
        t = self.t
        for x in output_ids[self.pos:]:
            if self.segment is None:
                if x in self.close_of:
                    self.segment, self.close = self.close_of[x]
                    self.seg_len = 0
            elif x == self.close:
                if x == t["</search>"]:
                    self.searches_here += 1
                self.segment, self.close = None, None
            else:
                self.seg_len += 1
            self.last = x
        self.pos = len(output_ids)

    def __call__(self, prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        t = self.t
        self._advance(output_ids)
        segment, close, seg_len = self.segment, self.close, self.seg_len
        if segment is None:  # between segments: force the next opening tag
            if self.last == t["</think>"]:
                pos = len(output_ids)
                if pos not in self.decisions:
                    self.decisions[pos] = self._choose(prompt_ids, self.searches_here)
                forced = self.decisions[pos]
            else:
                forced = t["<think>"]
            return _force(logits, forced)
        if seg_len >= self.cfg["max_len"][segment]:
            return _force(logits, close)
        if segment == "search" and self.search_only is not None:
            keep = logits[self.search_only.to(logits.device)].clone()
            logits.fill_(float("-inf"))
            logits[self.search_only.to(logits.device)] = keep
        else:
            logits[self.banned.to(logits.device)] = float("-inf")
        if seg_len >= 1:
            logits[close] = self.cfg["close_bias"][segment]
        return logits


def word_tokens(tokenizer: Any, min_chars: int = 4) -> list[int]:
    """Ids of vocabulary entries that are plain alphabetic words of at least `min_chars` letters (with or
    without a leading space): good material for steered search queries."""
    out = []
    for i in range(len(tokenizer)):
        piece = tokenizer.decode([i]).strip()
        if len(piece) >= min_chars and piece.isascii() and piece.isalpha():
            out.append(i)
    return out


def _force(logits: torch.Tensor, token: int) -> torch.Tensor:
    logits.fill_(float("-inf"))
    logits[token] = 0.0
    return logits


class SearchSteering(AdapterLogitsProcessor):
    """vLLM per-request logits processor applying `_Script` to requests that ask for it."""

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: SamplingParams):
        cfg = (params.extra_args or {}).get(KEY)
        if not cfg:
            return None
        return _Script(cfg, params.seed)
