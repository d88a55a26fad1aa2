"""Generation engines behind one small async `Generator` protocol: generate ONE turn from a list of
token ids, return the exact sampled ids and their log-probs. The agent loop (`agent.py`) only sees
this protocol, so it is unit-tested with a scripted fake and runs on vLLM in production.

- `VllmGenerator`: vLLM's `AsyncLLM` (v1 engine, continuous batching). Prompts go in as token ids
  (`TokensPrompt`), never text; a turn stops at the stop strings (kept in the output) or EOS; the
  log-prob of each sampled token comes from the engine (`logprobs=0` returns exactly the sampled
  token's). Weights are swapped in place with `collective_rpc("reload_weights", weights_path=…)`,
  then the prefix cache is reset (cached KV was computed under the old weights); the engine core runs
  in its own process, so the reload never blocks this process's event loop.
- `HfGenerator`: a tiny transformers fallback for environments without vLLM (one request at a time
  under a lock, in a thread; a reload reads the new weights and frees the old ones in a thread too).
  Slow; for laptops and `rollout once`, not for training.

A turn whose `TurnRequest.interrupt` is set stops at the next token boundary (vLLM: the request is
aborted by closing its output stream) and returns what it sampled, finish `interrupted`; the
interruptible rollouts of `partial.py` resume it under new weights.

A dead vLLM engine (its process killed, out of memory) surfaces as `GeneratorDead`, which the worker
treats as fatal (worker.py).

What this module does not do: parse actions, talk to the retriever, or decide turn budgets.

Departure from Search-R1: Search-R1 generates every turn to `max_tokens` and cuts the text after the
first `</search>`/`</answer>`, then re-tokenises; here generation stops at the tag and the sampled ids
are kept as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from searchr1.core.settings import default
from searchr1.rollout.broadcast_ext import WORKER_EXTENSION
from searchr1.rollout.settings import AgentSettings

if TYPE_CHECKING:
    from searchr1.rollout.settings import EngineSettings

log = logging.getLogger("searchr1.rollout.engine")

TurnFinish = Literal["stop", "eos", "length", "interrupted"]
"""How a turn ended: a stop string, the EOS token, its token budget, or its request's `interrupt` (the
tokens sampled so far are returned; `rollout/partial.py` resumes the turn after a weight swap)."""


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One turn to generate: the full context as token ids plus sampling parameters (their defaults are
    `AgentSettings`')."""

    prompt_ids: Sequence[int]
    max_tokens: int
    temperature: float = default(AgentSettings, "temperature")
    top_p: float = default(AgentSettings, "top_p")
    top_k: int = default(AgentSettings, "top_k")
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

    async def reload(self, weights_path: str) -> None: ...

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


RESET_TRIES = 10
"""Attempts at resetting vLLM's prefix cache after a reload (50 ms apart)."""

VLLM_ENGINE_FIELDS = frozenset({
    "gpu_memory_utilization", "max_model_len", "dtype", "enforce_eager", "seed", "max_num_seqs",
    "tensor_parallel_size", "logprobs_mode", "enable_prefix_caching"})
"""The `EngineSettings` fields that are vLLM engine arguments of the same name and meaning."""


@dataclass(frozen=True, slots=True)
class VllmEngineConfig:
    """What `VllmGenerator.start` needs: the model and its `EngineSettings` (the engine's settings are
    declared once, there), plus the knobs only code sets."""

    model: str
    engine: EngineSettings
    enable_chunked_prefill: bool | None = None
    """None: vLLM's default, except off on CPU (see `VllmGenerator.start`)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further `AsyncEngineArgs` keywords."""


class VllmGenerator:
    """`Generator` over vLLM's `AsyncLLM`. Build it with `await VllmGenerator.start(config)`."""

    def __init__(self, engine: Any, eos_token_ids: Sequence[int], extension: bool = False) -> None:
        self.engine = engine
        self.eos_token_ids = set(eos_token_ids)
        self.extension = extension
        """Whether the engine runs searchr1's worker extension (`broadcast_ext.py`)."""

    @classmethod
    async def start(cls, config: VllmEngineConfig) -> VllmGenerator:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        chunked = config.enable_chunked_prefill
        if chunked is None and current_platform.is_cpu():
            # vLLM 0.32 CPU: a seeded request whose prefill is split across steps crashes the engine
            # ("CPU Generator does not use offset" in gpu_model_runner's discard path); per-task seeds
            # are part of our wire format, so chunked prefill is off on CPU unless asked for.
            chunked = False
        e = config.engine
        # searchr1's worker extension (`broadcast_ext.py`): broadcast weight receipt and the CPU reload fix
        extra = {"worker_extension_cls": WORKER_EXTENSION, **config.extra}
        args = AsyncEngineArgs(
            model=config.model,
            **e.model_dump(include=VLLM_ENGINE_FIELDS),
            logits_processors=list(e.logits_processors) or None,
            enable_chunked_prefill=chunked,
            **({"max_num_batched_tokens": max(e.max_model_len, 2048)} if chunked is False else {}),
            **extra,
        )
        engine = AsyncLLM.from_engine_args(args)
        tok = engine.get_tokenizer()
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        gen_eos = getattr(engine.model_config.hf_config, "eos_token_id", None)
        if isinstance(gen_eos, int):
            eos.add(gen_eos)
        elif isinstance(gen_eos, list):
            eos.update(gen_eos)
        generator = cls(engine, sorted(eos), extension=extra["worker_extension_cls"] == WORKER_EXTENSION)
        # an exception traceback kept by an import inside vLLM's start-up holds this frame (seen with
        # gc.get_referrers in a fresh process): let only `generator` own the engine, so close() frees it
        # (the slow test_eval_command_end_to_end checks the eval's output for the traceback)
        del engine
        return generator

    def tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            seed=request.seed,
            stop=list(request.stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,
            extra_args=request.extra_args,
        )
        final = None
        interrupted = False
        with _dead_engine_is_fatal():
            # each streamed output is cumulative; closing the stream early aborts the request in vLLM
            async with contextlib.aclosing(self.engine.generate(
                    TokensPrompt(prompt_token_ids=list(request.prompt_ids)), params, request_id)) as stream:
                async for out in stream:
                    final = out
                    if request.interrupt is not None and request.interrupt.is_set() and not out.finished:
                        interrupted = True
                        break
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM returned no output for {request_id}")
        comp = final.outputs[0]
        ids = list(comp.token_ids)
        lps: list[float] = []
        for tid, entry in zip(ids, comp.logprobs or []):
            lp = entry[tid].logprob if entry and tid in entry else 0.0
            lps.append(min(0.0, float(lp)) if math.isfinite(lp) else -1e4)
        if len(lps) != len(ids):  # engine returned no log-probs (should not happen with logprobs=0)
            lps = [0.0] * len(ids)
        if interrupted:
            finish: TurnFinish = "interrupted"
        elif comp.finish_reason == "length":
            finish = "length"
        elif isinstance(comp.stop_reason, str) and comp.stop_reason in request.stop:
            finish = "stop"
        else:  # EOS (stop_reason None) or a stop token id
            finish = "eos"
        return TurnOutput(ids, lps, comp.text, finish, comp.stop_reason if finish == "stop" else None)

    async def reload(self, weights_path: str) -> None:
        with _dead_engine_is_fatal():
            await self.engine.collective_rpc("reload_weights", kwargs={"weights_path": weights_path})
            if self.extension:  # vLLM CPU: the LM head's packed GEMM is not rebuilt by the reload
                await self.engine.collective_rpc("searchr1_refresh_cpu_gemm")
            # False while running requests hold blocks: an interrupted turn's abort may still be on its way
            # to the engine core, so a few tries before giving up
            for _ in range(RESET_TRIES):
                if await self.engine.reset_prefix_cache():
                    break
                await asyncio.sleep(0.05)
            else:
                log.warning("vLLM kept its prefix cache after a weight reload (requests still running): cached "
                            "prompt blocks were computed with the previous weights")

    async def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()
            # AsyncLLM.__del__ shuts down again; left to interpreter exit it runs after module teardown
            # and prints a TypeError traceback into every demo log. Collect it now, while vLLM is alive.
            del engine
            gc.collect()


@contextlib.contextmanager
def _dead_engine_is_fatal() -> Iterator[None]:
    """vLLM's `EngineDeadError` (its engine process is gone) → `GeneratorDead`."""
    from vllm.v1.engine.exceptions import EngineDeadError

    try:
        yield
    except EngineDeadError as exc:
        raise GeneratorDead(f"vLLM's engine died: {exc}") from exc


class HfGenerator:
    """A slow transformers fallback `Generator` (no vLLM): sequential sampling with a KV cache, stop
    strings checked on the decoded turn text. For laptops and the `rollout once` command."""

    def __init__(self, model_dir: str, threads: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self._tok = AutoTokenizer.from_pretrained(model_dir)
        self._model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        eos = self._model.generation_config.eos_token_id
        self._eos = {eos} if isinstance(eos, int) else set(eos or [])
        if self._tok.eos_token_id is not None:
            self._eos.add(self._tok.eos_token_id)
        self._lock = asyncio.Lock()

    def tokenizer(self) -> Any:
        return self._tok

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        async with self._lock:
            return await asyncio.to_thread(self._generate_sync, request)

    def _generate_sync(self, request: TurnRequest) -> TurnOutput:
        import torch

        gen = torch.Generator().manual_seed(request.seed if request.seed is not None else 0)
        ids: list[int] = []
        lps: list[float] = []
        past = None
        inp = torch.tensor([list(request.prompt_ids)])
        finish: TurnFinish = "length"
        stop_reason = None
        with torch.no_grad():
            for _ in range(request.max_tokens):
                if request.interrupt is not None and request.interrupt.is_set():
                    finish = "interrupted"
                    break
                out = self._model(input_ids=inp, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                if request.temperature > 0:
                    logits = logits / request.temperature
                if request.top_k > 0:
                    kth = torch.topk(logits, min(request.top_k, logits.numel())).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                logp = torch.log_softmax(logits, -1)
                if request.top_p < 1.0:
                    sorted_lp, order = torch.sort(logp, descending=True)
                    cum = sorted_lp.exp().cumsum(0)
                    drop = cum - sorted_lp.exp() > request.top_p
                    logp = logp.clone()
                    logp[order[drop]] = float("-inf")
                    logp = torch.log_softmax(logp, -1)
                if request.temperature == 0:
                    tid = int(torch.argmax(logp))
                else:
                    tid = int(torch.multinomial(logp.exp(), 1, generator=gen))
                ids.append(tid)
                lps.append(float(logp[tid]))
                if tid in self._eos:
                    finish = "eos"
                    break
                text = self._tok.decode(ids, skip_special_tokens=True)
                hit = next((s for s in request.stop if s in text), None)
                if hit is not None:
                    finish, stop_reason = "stop", hit
                    break
                inp = torch.tensor([[tid]])
        return TurnOutput(ids, lps, self._tok.decode(ids, skip_special_tokens=True), finish, stop_reason)

    async def reload(self, weights_path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        async with self._lock:
            new = await asyncio.to_thread(
                lambda: AutoModelForCausalLM.from_pretrained(weights_path, dtype=torch.float32).eval())
            # the old model's tensors are freed in a thread too: its last reference goes with `old.clear`
            old, self._model = [self._model], new
            await asyncio.to_thread(old.clear)

    async def close(self) -> None:
        return None
