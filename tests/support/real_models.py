"""Real pretrained models for tests: `searchr1 models prepare` once per machine (the per-machine cache,
~/.cache/searchr1 or $SEARCHR1_CACHE), shared by every test and session after the first. Preparing
needs PyPI once; without it the test fails with the fetch error's message."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def prepared(name: str) -> Path:
    """The folder of catalogue model `name`, prepared on first use (SmolLM2: ~20 s on 2 cores)."""
    from searchr1.models.prepare import prepare_packaged

    folder, _ = prepare_packaged(name)
    return folder


@functools.cache
def tokenizer(name: str):
    """The transformers tokenizer of a prepared catalogue model (`smollm2-135m`, `qwen2.5-tokenizer`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepared(name))
