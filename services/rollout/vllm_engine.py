"""`VllmGenerator`: the `Generator` (`engine.py`'s protocol) over vLLM's `AsyncLLM` (v1 engine, continuous
batching). Prompts go in as token ids (`TokensPrompt`), never text; a turn stops at the stop strings (kept
in the output) or EOS; the log-prob of each sampled token comes from the engine (`logprobs=0` returns
exactly the sampled token's). Weights are swapped in place — a snapshot announced with a digest through
the worker extension, which verifies the bytes as it reads them and loads those (`reload`) — then the
prefix cache is reset (cached KV was computed under the old weights); the
engine core runs in its own process, so the reload never blocks this process's event loop. A turn whose
request's `interrupt` is set is aborted by closing its output stream; a dead engine raises
`GeneratorDead`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from searchr1.core.protocol import STOP_STRINGS
from searchr1.rollout.engine import GeneratorDead, TurnFinish, TurnOutput, TurnRequest
from searchr1.weightsync import WORKER_EXTENSION, DeltaRefused, apply_engine_delta, reload_engine

if TYPE_CHECKING:
    from searchr1.rollout.settings import EngineSettings

log = logging.getLogger("searchr1.rollout.engine")


CPU_BLOCK_SIZE = 32
"""KV block size on CPU when `EngineSettings.block_size` is None: the smallest vLLM 0.32's CPU attention
accepts (multiples of 32)."""

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


def single_token_stops(tokenizer: Any, stops: Sequence[str]) -> dict[str, int]:
    """The stop strings that are one token of `tokenizer` (encoded alone to one id that decodes back to
    exactly the string, e.g. the Search-R1 tags when they are added tokens), each with its id."""
    out = {}
    for s in stops:
        ids = tokenizer.encode(s, add_special_tokens=False)
        if len(ids) == 1 and tokenizer.decode(ids) == s:
            out[s] = ids[0]
    return out


class VllmGenerator:
    """`Generator` over vLLM's `AsyncLLM`. Build it with `await VllmGenerator.start(config)`."""

    def __init__(self, engine: Any, eos_token_ids: Sequence[int], extension: bool = False,
                 stop_ids: dict[str, int] | None = None) -> None:
        self.engine = engine
        self.eos_token_ids = set(eos_token_ids)
        self.extension = extension
        """Whether the engine runs searchr1's worker extension (`searchr1.weightsync.WORKER_EXTENSION`)."""
        self.last_load_times: dict[str, float] = {}
        """Where the last verified snapshot load spent its time (weight sync's `LoadTimes`)."""
        self.stop_ids = dict(stop_ids or {})
        """Stop strings that are single tokens, with their ids (`single_token_stops`): a turn also stops on
        the id, in the engine core, at the step that sampled it. A stop string alone is matched on the
        detokenised text in this process, after the engine has gone on sampling for the request (a token
        or two more per turn, discarded) until the abort reaches it."""

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
        block = e.block_size if e.block_size is not None or not current_platform.is_cpu() else CPU_BLOCK_SIZE
        # searchr1's worker extension (weight sync's reload protocol): verified snapshot loads, broadcast
        # weight receipt and the CPU reload fix
        extra = {"worker_extension_cls": WORKER_EXTENSION, **config.extra}
        args = AsyncEngineArgs(
            model=config.model,
            **e.model_dump(include=VLLM_ENGINE_FIELDS),
            logits_processors=list(e.logits_processors) or None,
            enable_chunked_prefill=chunked,
            **({"max_num_batched_tokens": max(e.max_model_len, 2048)} if chunked is False else {}),
            **({"block_size": block} if block is not None else {}),
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
        generator = cls(engine, sorted(eos), extension=extra["worker_extension_cls"] == WORKER_EXTENSION,
                        stop_ids=single_token_stops(tok, STOP_STRINGS))
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
            stop_token_ids=[self.stop_ids[s] for s in request.stop if s in self.stop_ids] or None,
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
        else:
            finish, stop = self._stop_of(comp.stop_reason, request.stop)
            return TurnOutput(ids, lps, comp.text, finish, stop)
        return TurnOutput(ids, lps, comp.text, finish, None)

    def _stop_of(self, reason: str | int | None, stops: Sequence[str]) -> tuple[TurnFinish, str | None]:
        """The finish of a turn vLLM stopped with `reason`: one of `stops` (matched as text, or as the id of
        a single-token one) → ("stop", the string); EOS (None) or another stop id → ("eos", None)."""
        if isinstance(reason, str) and reason in stops:
            return "stop", reason
        for s in stops:
            if reason is not None and self.stop_ids.get(s) == reason:
                return "stop", s
        return "eos", None

    async def reload(self, weights_path: str, digest: str | None = None) -> None:
        """Swap the weights in place (weight sync's `reload_engine`). With the announced `digest`, the
        engine reads the snapshot verified as it reads it and loads those bytes; a refused snapshot raises
        `SnapshotError` with the weights unchanged."""
        with _dead_engine_is_fatal():
            times = await reload_engine(self.engine, weights_path, digest, extension=self.extension)
            if times:
                self.last_load_times = times
            await self._reset_prefix_cache()

    async def apply_delta(self, delta_path: str, digest: str) -> None:
        """Apply the delta version at `delta_path` to the engine's weights in place (weight sync's
        `apply_engine_delta`, verified against the announced `digest`); a refused delta raises
        `DeltaRefused` with the weights unchanged."""
        if not self.extension:
            raise DeltaRefused("the engine runs without searchr1's worker extension: it loads full versions only")
        with _dead_engine_is_fatal():
            self.last_load_times = await apply_engine_delta(self.engine, delta_path, digest)
            await self._reset_prefix_cache()

    async def _reset_prefix_cache(self) -> None:
        # False while running requests hold blocks: an interrupted turn's abort may still be on its way
        # to the engine core, so a few tries before giving up
        for _ in range(RESET_TRIES):
            if await self.engine.reset_prefix_cache():
                return
            await asyncio.sleep(0.05)
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
