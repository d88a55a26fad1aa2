"""A learner's sequence of published versions without the learner: a model's fp32 weights nudged each
version by a small random step (a few percent of the bf16 values cross a rounding boundary, as an fp32
master at the recipe's lr does), published in bf16 through the real `SnapshotTransport`. For the weight
delta tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class Versions:
    """The masters, the model (for its config) and every published state (bf16), by version."""

    model: Any
    masters: dict[str, torch.Tensor]
    step: float = 1e-3
    """Each step moves every master by N(0, step²) times its tensor's RMS."""
    published: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    seed: int = 0

    @classmethod
    def of(cls, model_dir: Path, step: float = 1e-3) -> Versions:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        masters = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:  # published once, as the learner's export does
            masters.pop("lm_head.weight", None)
        return cls(model, masters, step)

    def state(self, version: int) -> dict[str, torch.Tensor]:
        """The bf16 state of `version` (moving the masters on to it; each version's state is kept)."""
        while len(self.published) <= version:
            v = len(self.published)
            if v:
                g = torch.Generator().manual_seed(self.seed * 100_003 + v)
                for t in self.masters.values():
                    if t.is_floating_point():
                        rms = float(t.float().pow(2).mean().sqrt()) or 1.0
                        t.add_(torch.randn(t.shape, generator=g) * (self.step * rms))
            self.published[v] = {k: t.to(torch.bfloat16) if t.is_floating_point() else t.clone()
                                 for k, t in self.masters.items()}
        return {k: t.clone() for k, t in self.published[version].items()}

    async def publish(self, transport: Any, version: int) -> Any:
        return await transport.publish(version, self.model, self.state(version))
