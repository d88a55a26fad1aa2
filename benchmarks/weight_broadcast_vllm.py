"""The vLLM receiving end of `weight_broadcast.py` (`--vllm`): a real vLLM CPU engine of the size, started
with searchr1's worker extension, receives each publication the way a rollout worker does, and reports
where its own time went (`searchr1_last_load_times`):

- broadcast: the learner's `Broadcaster.send` while the engine runs `receive_broadcast` (the rollout's own
  call): `receive_s` (on the wire, the xxh3 digest, unpacking), `load_weights_s` (vLLM's `load_weights`
  through the runner's in-place `reload_weights`), `gemm_repack_s` (`refresh_cpu_gemm`);
- snapshot: the learner's `WeightPublisher.write`, then `VllmGenerator.reload(path, digest)`:
  `read_verify_s` (the snapshot read into memory, every chunk checked), `load_weights_s`, `gemm_repack_s`.

The engine starts from a snapshot of the same model with the tiny test tokenizer (a tokenizer smaller than
the model's vocabulary: vLLM needs one, generation is not measured).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path


async def start_engine(model, work: Path, dtype: str):
    from searchr1.rollout.settings import EngineSettings
    from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator
    from searchr1.weightsync import WeightPublisher
    from tests.support.tiny_lm import build_tokenizer

    engine_dir = await asyncio.to_thread(WeightPublisher(work / "engine", keep=1).write, 0, model, model.state_dict())
    build_tokenizer().save_pretrained(engine_dir)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return await VllmGenerator.start(VllmEngineConfig(model=str(engine_dir), engine=EngineSettings(
        gpu_memory_utilization=0.05, max_model_len=512, dtype=dtype, max_num_seqs=4)))


async def _times(engine) -> dict[str, float]:
    return dict((await engine.engine.collective_rpc("searchr1_last_load_times"))[0])


async def broadcast_into(engine, bc, version: int, named) -> dict[str, float]:
    from searchr1.weightsync import receive_broadcast

    t0 = time.perf_counter()
    sent, got = await asyncio.gather(asyncio.to_thread(bc.send, version, named), receive_broadcast(engine, bc.uri(version)))
    end_to_end = time.perf_counter() - t0
    if sent != got:
        raise RuntimeError("broadcast digest mismatch in the vLLM engine")
    return {**await _times(engine), "end_to_end_s": end_to_end}


async def snapshot_into(engine, publisher, version: int, model) -> dict[str, float]:
    t0 = time.perf_counter()
    path = await asyncio.to_thread(publisher.write, version, model, model.state_dict())
    write = time.perf_counter() - t0
    await engine.reload(str(path), publisher.digest(version))
    end_to_end = time.perf_counter() - t0
    await asyncio.to_thread(publisher.prune)
    return {**engine.last_load_times, "write_s": write, "end_to_end_s": end_to_end}


async def vllm_runs(model, named, dtype: str, work: Path, runs: int, bucket_bytes: int) -> dict[str, list]:
    """`runs` broadcasts and snapshots into one vLLM engine of `model`, taking turns."""
    from searchr1.weightsync import Broadcaster, WeightPublisher

    engine = await start_engine(model, work, dtype)
    bc = Broadcaster("127.0.0.1", 0, 2, backend="gloo", timeout_s=600, bucket_bytes=bucket_bytes)
    publisher = WeightPublisher(work / "vllm-snapshots", keep=1)
    out: dict[str, list] = {"broadcast": [], "snapshot": [], "loads": []}
    try:
        for r in range(runs):
            out["broadcast"].append(await broadcast_into(engine, bc, r + 1, named))
            out["snapshot"].append(await snapshot_into(engine, publisher, r + 1, model))
            out["loads"].append(os.getloadavg()[0])
    finally:
        bc.close()
        await engine.close()
    return out
