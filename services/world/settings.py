"""Settings of the tiny world: generator sizes, tokenizer, model shape and warm start.

Loaded with `searchr1.core.settings.load_settings(WorldSettings, config, **overrides)` from the `[world]`
table of a run config (e.g. `configs/world-default.toml`), overridden by `WORLD_…` environment variables
(nested with `__`, e.g. `WORLD_WARMSTART__STEPS=300`).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from searchr1.core.settings import Section, ServiceSettings


class GeneratorSettings(Section):
    """How many entities of each kind the world holds, and how many of them are *known*."""

    people: int = Field(default=100, ge=4, le=100_000)
    """People (subjects of most questions)."""
    cities: int = Field(default=24, ge=4, le=100_000)
    """Cities (birthplaces and headquarters)."""
    companies: int = Field(default=20, ge=4, le=100_000)
    """Companies (employers)."""
    countries: int = Field(default=6, ge=3, le=10_000)
    """Countries (answers of city and two-hop questions)."""
    known_people: int = Field(default=8, ge=1, le=1_000)
    """People whose facts the warm start memorises (same in every warm-start epoch)."""
    known_cities: int = Field(default=4, ge=1, le=1_000)
    """Known cities (birthplaces and headquarters of known people and companies)."""
    known_companies: int = Field(default=4, ge=1, le=1_000)
    """Known companies (employers of known people)."""
    known_countries: int = Field(default=2, ge=1, le=1_000)
    """Known countries (where known cities lie)."""
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    """Fraction of unknown subject entities whose questions form the test split (held out)."""
    name_words: int = Field(default=640, ge=16, le=20_000)
    """Size of the name lexicon every name is built from; each word is one token of the world's tokenizer.
    A world uses 2 words per person and 1 per city, company and country, all distinct."""

    @model_validator(mode="after")
    def _known_fit(self) -> GeneratorSettings:
        for kind in ("people", "cities", "companies", "countries"):
            if getattr(self, f"known_{kind}") >= getattr(self, kind):
                raise ValueError(f"known_{kind} must be smaller than {kind}")
        if self.countries - self.known_countries < 1 or self.cities - self.known_cities < 2:
            raise ValueError("need at least one unknown country and two unknown cities")
        needed = 2 * self.people + self.cities + self.companies + self.countries
        if needed > 0.6 * self.name_words:
            raise ValueError(f"the world needs {needed} distinct name words: raise name_words to at least "
                             f"{int(needed / 0.6) + 1}")
        return self


class TokenizerSettings(Section):
    """The byte-level BPE tokenizer trained on the world's text."""

    vocab_size: int = Field(default=1024, ge=300, le=65_536)
    """BPE vocabulary size, special tokens and protocol tags included; the name lexicon's words
    (`generator.name_words`) are added on top, one token each."""
    min_frequency: int = Field(default=2, ge=1, le=1_000)
    """A pair must occur this often to be merged."""
    generic_worlds: int = Field(default=12, ge=1, le=1_000)
    """Other worlds (same generator settings, seeds of their own) whose text the BPE is trained on besides
    the target world's known entities (so the merges fit every world, not the target's passages)."""


class ModelSettings(Section):
    """Shape of the Qwen2-architecture policy built from config (no pretrained weights)."""

    hidden_size: int = Field(default=128, ge=32, le=8192)
    """Model width."""
    num_layers: int = Field(default=2, ge=1, le=64)
    """Decoder layers."""
    num_heads: int = Field(default=4, ge=1, le=128)
    """Attention heads; hidden_size / num_heads must be 32 or 64 (vLLM's CPU attention)."""
    num_kv_heads: int = Field(default=4, ge=1, le=128)
    """Key/value heads (grouped-query attention when smaller than num_heads)."""
    intermediate_size: int = Field(default=512, ge=32, le=65_536)
    """MLP width."""
    max_position: int = Field(default=2048, ge=256, le=131_072)
    """Longest sequence (prompt + all turns) in tokens."""
    rope_theta: float = Field(default=10_000.0, gt=0)
    """RoPE base."""
    init_seed: int = Field(default=0, ge=0)
    """Seed of the random initialisation."""

    @model_validator(mode="after")
    def _heads(self) -> ModelSettings:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.hidden_size // self.num_heads not in (32, 64):
            raise ValueError("head_dim (hidden_size / num_heads) must be 32 or 64 for vLLM's CPU attention")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class WarmstartSettings(Section):
    """The supervised warm start on synthetic protocol traces (the tiny world's 'pre-training')."""

    steps: int = Field(default=600, ge=1, le=1_000_000)
    """Optimiser steps on traces (after the copy pre-training)."""
    batch_size: int = Field(default=32, ge=1, le=4096)
    """Traces per step (mixed kinds, not length-sorted)."""
    micro_batch_tokens: int = Field(default=4096, ge=256, le=1_000_000)
    """Padded tokens per forward pass: a step's traces are grouped by length into micro-batches (gradients
    accumulated) so padding costs nothing while the step itself stays a mixed batch."""
    lr: float = Field(default=2e-3, gt=0, le=1.0)
    """Peak learning rate (AdamW), reached after warm-up, cosine-decayed to lr * min_lr_ratio."""
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    """Final learning rate as a fraction of the peak."""
    warmup_steps: int = Field(default=30, ge=0)
    """Linear warm-up steps."""
    weight_decay: float = Field(default=0.01, ge=0, le=1)
    """AdamW weight decay."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Gradient-norm clip."""
    seed: int = Field(default=0, ge=0)
    """Seed of trace sampling and of the fresh worlds (model init has its own seed)."""
    threads: int = Field(default=1, ge=1, le=256)
    """torch intra-op threads (set deliberately: the warm start shares small CPU hosts with the services)."""
    copy_steps: int = Field(default=2500, ge=0, le=1_000_000)
    """Copy pre-training steps before the traces (`training.copy_pretrain`; 0 skips it, and so does
    `--init`): drills of repeated random token sequences that teach the model to copy what it read."""
    copy_batch_size: int = Field(default=16, ge=1, le=4096)
    """Drills per copy pre-training step."""
    refresh_steps: int = Field(default=10, ge=1)
    """A freshly generated world (new unknown entities, same known ones) every this many steps, so the
    model must learn to read passages instead of memorising them."""
    known_fraction: float = Field(default=0.25, ge=0, le=1)
    """Share of traces about known entities."""
    two_hop_fraction: float = Field(default=0.35, ge=0, le=1)
    """Share of two-hop questions among unknown and known traces."""
    p_guess: float = Field(default=0.1, ge=0, le=1)
    """Unknown question answered from 'memory' without searching (a wrong guess)."""
    p_needless_search: float = Field(default=0.3, ge=0, le=1)
    """Known question searched anyway."""
    p_noisy_query: float = Field(default=0.15, ge=0, le=1)
    """Query with a misspelt or truncated name (retried with the right name if the hit is missing)."""
    p_wrong_copy: float = Field(default=0.08, ge=0, le=1)
    """Final restatement copies a fact of a distractor passage instead of the gold one."""
    topk: int = Field(default=3, ge=1, le=20)
    """Passages per search in the traces (Search-R1's default top-k is 3)."""
    log_every: int = Field(default=10, ge=1)
    """Record the mean loss every this many steps."""
    eval_questions: int = Field(default=64, ge=0, le=100_000)
    """Held-out test questions for the greedy self-check at the end (0 skips it)."""
    eval_every: int = Field(default=0, ge=0)
    """Also run the self-check (on up to 32 of those questions) every this many steps, for a learning
    curve in warmstart.json (0: only at the end)."""


class WorldSettings(ServiceSettings):
    """Everything `searchr1 world build` and `searchr1 world warmstart` need."""

    model_config = SettingsConfigDict(env_prefix="WORLD_")
    section: ClassVar[str] = "world"

    seed: int = Field(default=0, ge=0)
    """World seed: same seed and settings give byte-identical files."""
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
    """Entity counts."""
    tokenizer: TokenizerSettings = Field(default_factory=TokenizerSettings)
    """Tokenizer training."""
    model: ModelSettings = Field(default_factory=ModelSettings)
    """Model shape."""
    warmstart: WarmstartSettings = Field(default_factory=WarmstartSettings)
    """Warm start."""
