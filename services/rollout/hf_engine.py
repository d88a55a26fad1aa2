"""`HfGenerator`: a tiny transformers fallback `Generator` (`engine.py`'s protocol) for environments
without vLLM — one request at a time under a lock, in a thread; a reload reads the new weights (verified
as they are read, when announced with a digest) and frees the old ones in a thread too. Slow; for laptops
and `rollout once`, not for training.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from searchr1.rollout.engine import TurnFinish, TurnOutput, TurnRequest
from searchr1.weightsync import SnapshotError


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
        self._base: Any = None
        """The copy of the published version loaded last (`searchr1.weightsync.BaseWeights`), for deltas."""

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

    async def reload(self, weights_path: str, digest: str | None = None) -> None:
        """Load new weights; with the announced `digest`, from the snapshot's bytes verified as they are
        read (`searchr1.weightsync.read_verified`): a refused snapshot raises `SnapshotError` and the model
        in use stays."""
        async with self._lock:
            load = _load_path if digest is None else _load_verified
            new, base = await asyncio.to_thread(load, weights_path, digest)
            # the old model's tensors are freed in a thread too: its last reference goes with `old.clear`
            old, self._model, self._base = [self._model], new, base
            await asyncio.to_thread(old.clear)

    async def apply_delta(self, delta_path: str, digest: str) -> None:
        """Apply the delta version at `delta_path` (verified against `digest` as it is read) to the copy of
        the published version this engine loaded last, each resulting tensor checked, then copy the changed
        tensors into the model; a refused delta raises `DeltaRefused` and nothing changes."""
        async with self._lock:
            await asyncio.to_thread(_apply_delta, self._model, self._base, delta_path, digest)

    async def close(self) -> None:
        return None


def _load_path(weights_path: str, _digest: None) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(weights_path, dtype=torch.float32).eval(), None


def _apply_delta(model: Any, base: Any, delta_path: str, digest: str) -> None:
    import torch

    from searchr1.weightsync import DELTA_FILE, Delta, DeltaRefused, read_verified

    if base is None:
        raise DeltaRefused("the engine holds no verified copy of a published version to apply a delta to")
    files = read_verified(delta_path, digest)
    if DELTA_FILE not in files:
        raise DeltaRefused(f"{delta_path}: no {DELTA_FILE}")
    changed = base.apply(Delta.parse(files[DELTA_FILE]))
    with torch.no_grad():
        model.load_state_dict({name: base.tensors[name] for name in changed}, strict=False)
    model.tie_weights()


def _load_verified(weights_path: str, digest: str) -> Any:
    """The model built from the verified bytes of the snapshot at `weights_path`: its config.json and its
    safetensors tensors (copied into a float32 model; tied weights follow their source)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from searchr1.weightsync import base_of, read_verified, snapshot_tensors

    files = read_verified(weights_path, digest)
    if "config.json" not in files:
        raise SnapshotError(f"{weights_path}: no config.json in the snapshot")
    doc = json.loads(bytes(files["config.json"]))
    config = AutoConfig.for_model(doc.pop("model_type"), **doc)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        result = model.load_state_dict(dict(snapshot_tensors(files)), strict=False)
    if result.unexpected_keys:
        raise SnapshotError(f"{weights_path}: tensors the model does not have: {result.unexpected_keys[:5]}")
    model.tie_weights()
    return model.eval(), base_of(files, list(snapshot_tensors(files)))
