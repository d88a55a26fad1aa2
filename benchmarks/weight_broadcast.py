"""Weight sync in memory vs through a snapshot (`make bench-weights`, after `weight_sync.py`): the learner's
publication reaching one receiver process, end to end, same model, same run, taking turns.

    .venv/bin/python benchmarks/weight_broadcast.py [--sizes tiny,0.5b] [--repeats 2] [--bucket-mb 64]

- snapshot: the learner's streamed `WeightPublisher.write` (safetensors + sha256 in one pass) on local
  disk, then the receiver verifies it in place (`snapshot_digest`) and loads the tensors into its model
  (the shared-volume transport);
- broadcast: `searchr1.core.broadcast` over gloo on loopback: the learner packs and sends the tensors in
  buckets, the receiver receives each bucket, checks the digest and copies the tensors into its model;
  no file is written.

Models: `weight_sync.py`'s (the tiny world's shape in float32; a random Qwen2 with Qwen2.5-0.5B's shape in
bfloat16). The receiver is a separate process holding a transformers model of the same config (a vLLM CPU
engine of 0.5B does not fit beside the machine's other jobs; `tests/integration/test_weights_broadcast_vllm.py`
covers the vLLM receiving end). One receiver: the learner's send time grows with the receivers under gloo's
broadcast; NCCL figures need a GPU and are not taken here.

Prints, per size and path, the wall seconds from the start of the publication to the receiver's
acknowledgement, the bytes and GB/s, and the ratio snapshot / broadcast.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RECEIVER = r"""
import json, sys, time, torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM
from searchr1.core.broadcast import Receiver, parse_group_uri
from searchr1.core.weights import snapshot_digest
cfg = AutoConfig.from_pretrained(sys.argv[1])
dtype = getattr(torch, sys.argv[2])
model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
params = dict(model.state_dict())
rx = Receiver(timeout_s=300)
print("ready", flush=True)
for line in sys.stdin:
    kind, arg = line.split()
    with torch.no_grad():
        if kind == "snapshot":
            digest = snapshot_digest(arg)
            for name, t in load_file(f"{arg}/model.safetensors").items():
                params[name].copy_(t)
        else:
            addr, version = parse_group_uri(arg)
            if rx.address != addr:
                rx.join(addr)
            for name, t in rx.receive(version):
                params[name].copy_(t)
            digest = rx.last_digest
    print("done", digest, flush=True)
"""


class ReceiverProc:
    def __init__(self, config_dir: Path, dtype: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.p = subprocess.Popen([sys.executable, "-c", _RECEIVER, str(config_dir), dtype], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "ready"

    def ask(self, kind: str, arg: str) -> None:
        self.p.stdin.write(f"{kind} {arg}\n")
        self.p.stdin.flush()

    def wait(self) -> str:
        line = self.p.stdout.readline().split()
        if not line or line[0] != "done":
            raise RuntimeError(f"receiver failed: {line}")
        return line[1]

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(60)


def snapshot_round(publisher, version: int, model, rx: ReceiverProc) -> tuple[float, str]:
    t0 = time.perf_counter()
    path = publisher.write(version, model, model.state_dict())
    rx.ask("snapshot", str(path))
    digest = rx.wait()
    dt = time.perf_counter() - t0
    if digest != publisher.digest(version):
        raise RuntimeError("snapshot digest mismatch")
    publisher.prune()
    return dt, digest


async def broadcast_round(bc, version: int, named, rx: ReceiverProc) -> tuple[float, str]:
    t0 = time.perf_counter()
    rx.ask("broadcast", bc.uri(version))
    sent = await asyncio.to_thread(bc.send, version, named)
    got = await asyncio.to_thread(rx.wait)
    dt = time.perf_counter() - t0
    if got != sent:
        raise RuntimeError("broadcast digest mismatch")
    return dt, sent


async def run_size(size: str, args, work: Path) -> dict:
    from benchmarks.weight_sync import build_model
    from searchr1.core.broadcast import Broadcaster
    from searchr1.learner.publisher import WeightPublisher, drop_shared

    model, _ = build_model(size, work / size)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    model.config.save_pretrained(work / size / "config")
    named = sorted(drop_shared(model, model.state_dict()).items())
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    publisher = WeightPublisher(work / size / "snapshots", keep=1)
    rx = ReceiverProc(work / size / "config", dtype)
    bc = Broadcaster("127.0.0.1", 0, 2, timeout_s=300, bucket_bytes=args.bucket_mb << 20)
    rows: dict[str, list[float]] = {"snapshot": [], "broadcast": []}
    try:
        version = 0
        for _ in range(args.repeats):
            version += 1
            rows["snapshot"].append(snapshot_round(publisher, version, model, rx)[0])
            version += 1
            rows["broadcast"].append((await broadcast_round(bc, version, named, rx))[0])
    finally:
        rx.close()
        bc.close()
        del model, named
        gc.collect()
    return {"size": size, "bytes": nbytes, **rows, "load": os.getloadavg()}


def report(r: dict) -> str:
    gb = r["bytes"] / 1e9
    s, b = min(r["snapshot"]), min(r["broadcast"])
    fmt = ", ".join
    return (f"{r['size']:<5} {gb:6.3f} GB  snapshot {fmt(f'{x:.2f}' for x in r['snapshot'])} s "
            f"({gb / s:.3f} GB/s best)  broadcast {fmt(f'{x:.2f}' for x in r['broadcast'])} s ({gb / b:.3f} GB/s best)  "
            f"snapshot/broadcast {s / b:.1f}x (best of each)  load average {' '.join(f'{x:.1f}' for x in r['load'])}")


async def amain(args) -> None:
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="bcast-bench-"))
    print(f"receiver: one process, transformers model; gloo on loopback; buckets {args.bucket_mb} MiB; "
          f"{os.cpu_count()} cores", flush=True)
    results = []
    for size in args.sizes.split(","):
        r = await run_size(size, args, work)
        results.append(r)
        print(report(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="tiny,0.5b")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--bucket-mb", type=int, default=64)
    p.add_argument("--json", default=None)
    asyncio.run(amain(p.parse_args()))


if __name__ == "__main__":
    main()
