"""Generation engines behind one small async `Generator` protocol: generate ONE turn from a list of
token ids, return the exact sampled ids and their log-probs. The agent loop (`agent.py`) only sees
this protocol, so it is unit-tested with a scripted fake and runs on vLLM in production.

- `VllmGenerator` (`vllm_engine.py`): vLLM's `AsyncLLM` (v1 engine, continuous batching).
- `HfGenerator` (`hf_engine.py`): a tiny transformers fallback for environments without vLLM.

A turn whose `TurnRequest.interrupt` is set stops at the next token boundary (vLLM: the request is
aborted by closing its output stream) and returns what it sampled, finish `interrupted`; the
interruptible rollouts of `partial.py` resume it under new weights.

A dead engine (vLLM's process killed, out of memory) surfaces as `GeneratorDead`, which the worker
treats as fatal (worker.py).

What this module does not do: parse actions, talk to the retriever, or decide turn budgets.

Departure from Search-R1: Search-R1 generates every turn to `max_tokens` and cuts the text after the
first `</search>`/`</answer>`, then re-tokenises; here generation stops at the tag and the sampled ids
are kept as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

TurnFinish = Literal["stop", "eos", "length", "interrupted"]
"""How a turn ended: a stop string, the EOS token, its token budget, or its request's `interrupt` (the
tokens sampled so far are returned; `rollout/partial.py` resumes the turn after a weight swap)."""


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One turn to generate: the full context as token ids plus sampling parameters (the agent's
    `Sampling`, from `AgentSettings`)."""

    prompt_ids: Sequence[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None = None
    stop: Sequence[str] = ()
    extra_args: dict[str, Any] | None = None
    interrupt: asyncio.Event | None = None
    """Once set, generation stops at the next token boundary (vLLM aborts the request) and the turn ends
    `interrupted` with what it has sampled. None: the turn always runs to its end."""


@dataclass(frozen=True, slots=True)
class TurnOutput:
    """What one turn produced: sampled ids, the behaviour log-prob of each, the decoded text."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish: TurnFinish
    stop_reason: str | None = None
    versions: list[int] | None = None
    """The weight version that sampled each token (set by `rollout/partial.py`; None: not tracked)."""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError("token_ids and logprobs must have the same length")
        if self.versions is not None and len(self.versions) != len(self.token_ids):
            raise ValueError("versions and token_ids must have the same length")


class GeneratorDead(RuntimeError):
    """The generation engine is gone for good (vLLM's engine process died: killed, out of memory, a CUDA
    error). Nothing in this process can bring it back: the worker stops taking tasks, leaves the ones it
    holds unacked for redelivery and exits non-zero, so its supervisor (`searchr1 up`, Kubernetes)
    starts a fresh one."""


class Generator(Protocol):
    """An async engine that generates one turn at a time; many turns may run concurrently."""

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput: ...

    async def reload(self, weights_path: str, digest: str | None = None) -> None:
        """Swap in the weights at `weights_path`. With the announced `digest`, only bytes verified against
        it as they are read are loaded (`searchr1.weightsync.read_verified`); a refused snapshot raises
        `SnapshotError` before anything is loaded."""
        ...

    async def close(self) -> None: ...


class TextCodec(Protocol):
    """Tokenises environment text and decodes responses (special tokens kept)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass
class HfCodec:
    """`TextCodec` over a transformers tokenizer: no BOS/EOS added, special tokens kept on decode
    (Search-R1 scores the decoded text with special tokens)."""

    tokenizer: Any

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)
