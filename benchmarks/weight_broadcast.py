"""Weight sync in memory vs through a snapshot (`make bench-weights`, after `weight_sync.py`): the learner's
publication reaching one receiver process, end to end, same model, same run, taking turns.

    .venv/bin/python benchmarks/weight_broadcast.py [--sizes tiny,0.5b] [--runs 2] [--bucket-mb 64]
                                                    [--no-snapshot] [--vllm 0.5b] [--json out.json]

- snapshot: the learner's streamed `WeightPublisher.write` (safetensors, chunk digests hashed beside the
  write) on local disk, then the receiver reads it verified (`read_verified`: every chunk checked as it
  is read) and copies the tensors from those bytes into its model (the shared-volume transport);
- broadcast: weight sync's broadcast wire (`searchr1.weightsync.Broadcaster`) over gloo on loopback: the learner packs and sends the tensors in
  buckets, the receiver receives each bucket, checks the digest and copies the tensors into its model;
  no file is written.

Models: `weight_sync.py`'s (the tiny world's shape in float32; a random Qwen2 with Qwen2.5-0.5B's shape in
bfloat16). The receiver is a separate process holding a transformers model of the same config; `--vllm`
adds a vLLM CPU engine of the size as a second receiver, measured after the transformers rounds (its
correctness is `tests/integration/test_weights_broadcast_vllm.py`'s). One receiver: the learner's send time grows with the receivers under gloo's
broadcast; NCCL figures need a GPU and are not taken here.

- floor: between the same two processes, over the same gloo group, the same bytes in the same 64 MiB
  buckets: one pack of each bucket into a reused buffer, the bucket on the wire, one copy of each tensor
  into the receiver's model — no header beyond the bucket plan, no hash, no pipelining.

- wire: the packed buckets alone on the wire between the same two processes (no pack, no hash, nothing
  copied out).

Each round runs broadcast, floor (and snapshot), then wire, back to back; prints per round the wall
seconds from the start of the publication to the receiver's acknowledgement, GB/s, ours as a share of
the floor of the same round (floor time / broadcast time), the median and range of the shares and the
load average; then the table of where the time goes: the CPU phases measured alone in the learner's
process (pack, xxh3, one copy of every byte), the wire, the end-to-end rows, and with `--vllm` a real
vLLM CPU engine's own account of a broadcast and a snapshot reload (`weight_broadcast_vllm.py`: receive,
`load_weights`, the CPU GEMM re-pack, the verified read). `--runs N` rounds; medians and ranges.
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
from transformers import AutoConfig, AutoModelForCausalLM
from searchr1.weightsync import Receiver, parse_group_uri, read_verified, snapshot_tensors
from searchr1.weightsync.broadcast import broadcast_bytes, broadcast_tensor
from searchr1.weightsync.buckets import bucket_bytes_of, unpack_bucket
cfg = AutoConfig.from_pretrained(sys.argv[1])
dtype = getattr(torch, sys.argv[2])
model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
params = dict(model.state_dict())
rx = Receiver(backend="gloo", timeout_s=300)
print("ready", flush=True)
for line in sys.stdin:
    kind, arg = line.split()
    with torch.no_grad():
        if kind == "floor":  # bare: the bucket plan, then each bucket on the wire and one copy into the model
            plan = json.loads(broadcast_bytes(rx._pg, None, "cpu"))
            sizes = [bucket_bytes_of(specs) for specs in plan]
            buf = torch.empty(max(sizes), dtype=torch.uint8)
            for specs, n in zip(plan, sizes):
                broadcast_tensor(rx._pg, buf[:n])
                for name, t in unpack_bucket(buf[:n], specs):
                    params[name].copy_(t)
            digest = "floor"
        elif kind == "wire":  # the packed buckets alone: on the wire into one buffer, nothing copied out
            sizes = json.loads(broadcast_bytes(rx._pg, None, "cpu"))
            buf = torch.empty(max(sizes), dtype=torch.uint8)
            for n in sizes:
                broadcast_tensor(rx._pg, buf[:n])
            digest = "wire"
        elif kind == "snapshot":  # the volume transport: read verified, then copied from those bytes
            path, announced = arg.split("@")
            files = read_verified(path, announced)
            for name, t in snapshot_tensors(files):
                params[name].copy_(t)
            digest = announced
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
    rx.ask("snapshot", f"{path}@{publisher.digest(version)}")
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


def floor_round(bc, named, buckets, rx: ReceiverProc) -> float:
    """The floor between the same two processes, on the same gloo group: one pack per bucket (into one
    reused buffer), the bucket on the wire, one copy into the receiver's model; no hash, no header beyond
    the bucket plan, no pipelining."""
    import torch

    from searchr1.weightsync.broadcast import broadcast_bytes, broadcast_tensor
    from searchr1.weightsync.buckets import padded, tensor_nbytes

    specs = [{"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for n, t in named]
    plan = [[specs[i] for i in b] for b in buckets]
    biggest = max(sum(padded(tensor_nbytes(named[i][1])) for i in b) for b in buckets)
    buf = torch.zeros(biggest, dtype=torch.uint8)
    t0 = time.perf_counter()
    rx.ask("floor", "bare")
    broadcast_bytes(bc._pg, json.dumps(plan).encode(), torch.device("cpu"))
    for b in buckets:
        off = 0
        for i in b:
            t = named[i][1]
            n = tensor_nbytes(t)
            buf[off:off + n].copy_(t.detach().reshape(-1).view(torch.uint8))
            off += padded(n)
        broadcast_tensor(bc._pg, buf[:off])
    rx.wait()
    return time.perf_counter() - t0


def phase_costs(named, buckets) -> tuple[dict[str, float], list]:
    """Seconds of each CPU phase of one publication, measured alone in this process: packing the buckets
    (`pack_bucket`, hash excluded), xxh3-128 over the packed bytes (once per side), and one copy of every
    byte (what the receiver's copy into its model costs)."""
    import torch
    import xxhash

    from searchr1.weightsync.buckets import pack_bucket

    class _NoHash:
        def update(self, _):
            pass

    t0 = time.perf_counter()
    flats = [pack_bucket([named[i][1] for i in b], _NoHash()) for b in buckets]
    pack = time.perf_counter() - t0
    t0 = time.perf_counter()
    h = xxhash.xxh3_128()
    for f in flats:
        h.update(memoryview(f.numpy()))
    hashing = time.perf_counter() - t0
    dst = [torch.empty_like(f) for f in flats]
    t0 = time.perf_counter()
    for d, f in zip(dst, flats):
        d.copy_(f)
    copy = time.perf_counter() - t0
    return {"pack": pack, "hash": hashing, "copy": copy}, flats


def wire_round(bc, flats, rx: ReceiverProc) -> float:
    """The packed buckets alone on the wire, between the same two processes on the same group: no pack,
    no hash, nothing copied out on the receiving side."""
    import torch

    from searchr1.weightsync.broadcast import broadcast_bytes, broadcast_tensor

    t0 = time.perf_counter()
    rx.ask("wire", "bare")
    broadcast_bytes(bc._pg, json.dumps([int(f.numel()) for f in flats]).encode(), torch.device("cpu"))
    for f in flats:
        broadcast_tensor(bc._pg, f)
    rx.wait()
    return time.perf_counter() - t0


async def run_size(size: str, args, work: Path) -> dict:
    from benchmarks.weight_sync import build_model
    from searchr1.weightsync import Broadcaster, WeightPublisher, drop_shared
    from searchr1.weightsync.buckets import padded, plan_buckets, tensor_nbytes

    model, _ = build_model(size, work / size)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    model.config.save_pretrained(work / size / "config")
    named = sorted(drop_shared(model, model.state_dict()).items())
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    publisher = WeightPublisher(work / size / "snapshots", keep=1)
    rx = ReceiverProc(work / size / "config", dtype)
    bc = Broadcaster("127.0.0.1", 0, 2, backend="gloo", timeout_s=300, bucket_bytes=args.bucket_mb << 20)
    buckets = plan_buckets([padded(tensor_nbytes(t)) for _, t in named], args.bucket_mb << 20)
    rows: dict[str, list] = {"snapshot": [], "broadcast": [], "floor": [], "wire": [], "phases": [], "loads": []}
    try:
        version = 0
        for _ in range(args.runs):
            version += 1
            rows["broadcast"].append((await broadcast_round(bc, version, named, rx))[0])  # forms the group
            rows["floor"].append(await asyncio.to_thread(floor_round, bc, named, buckets, rx))
            if not args.no_snapshot:
                version += 1
                rows["snapshot"].append(snapshot_round(publisher, version, model, rx)[0])
            phases, flats = phase_costs(named, buckets)
            rows["wire"].append(await asyncio.to_thread(wire_round, bc, flats, rx))
            del flats
            rows["phases"].append(phases)
            rows["loads"].append(os.getloadavg()[0])
    finally:
        rx.close()
        bc.close()
    vllm = None
    if size in args.vllm:
        from benchmarks.weight_broadcast_vllm import vllm_runs

        vllm = await vllm_runs(model, named, dtype, work / size, args.runs, args.bucket_mb << 20)
    del model, named
    gc.collect()
    return {"size": size, "bytes": nbytes, **rows, "vllm": vllm, "load": os.getloadavg()}


def _med(xs) -> str:
    import statistics

    xs = list(xs)
    return f"{statistics.median(xs):.3f}" if len(xs) == 1 else f"{statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})"


def rounds(r: dict) -> str:
    """Per round: broadcast, floor, share (floor / broadcast, paired in the round), snapshot; then the
    median and spread of the shares."""
    import statistics

    gb = r["bytes"] / 1e9
    lines = [f"{r['size']}: {gb:.3f} GB, {len(r['broadcast'])} rounds"]
    shares = [f / b for f, b in zip(r["floor"], r["broadcast"])]
    for i, (b, f) in enumerate(zip(r["broadcast"], r["floor"])):
        snap = f"  snapshot {r['snapshot'][i]:.3f} s" if r["snapshot"] else ""
        lines.append(f"  round {i + 1}: broadcast {b:.3f} s ({gb / b:.2f} GB/s)  floor {f:.3f} s ({gb / f:.2f} GB/s)  "
                     f"ours = {shares[i]:.0%} of the floor{snap}  load {r['loads'][i]:.1f}")
    lines.append(f"  ours / floor: median {statistics.median(shares):.0%}, range {min(shares):.0%}–{max(shares):.0%}")
    return "\n".join(lines)


def where_the_time_goes(r: dict) -> str:
    """The table: each phase's median (range) seconds over the runs and its rate. Phases overlap in the
    pipelined transfer, so they do not add up to the end-to-end rows."""
    import statistics

    gb = r["bytes"] / 1e9
    rows = [("pack into 64 MiB buckets (learner, measured alone)", [p["pack"] for p in r["phases"]]),
            ("xxh3-128 of every byte (each side, measured alone)", [p["hash"] for p in r["phases"]]),
            ("one copy of every byte (memcpy, measured alone)", [p["copy"] for p in r["phases"]]),
            ("on the wire: the packed buckets, gloo on loopback", r["wire"]),
            ("floor: pack + wire + one copy into the model, end to end", r["floor"]),
            ("broadcast into a transformers model, end to end", r["broadcast"])]
    if r["snapshot"]:
        rows.append(("snapshot into a transformers model: write, verified read, copy", r["snapshot"]))
    v = r.get("vllm")
    if v:
        b, s = v["broadcast"], v["snapshot"]
        rows += [("vLLM engine, broadcast: receive (wire, xxh3, unpack)", [x["receive_s"] for x in b]),
                 ("vLLM engine, broadcast: load_weights", [x["load_weights_s"] for x in b]),
                 ("vLLM engine, broadcast: CPU GEMM re-pack", [x.get("gemm_repack_s", 0.0) for x in b]),
                 ("vLLM engine, broadcast end to end", [x["end_to_end_s"] for x in b]),
                 ("vLLM engine, snapshot: publisher write (manifest hashed beside it)", [x["write_s"] for x in s]),
                 ("vLLM engine, snapshot: read into memory, every chunk verified", [x["read_verify_s"] for x in s]),
                 ("vLLM engine, snapshot: load_weights", [x["load_weights_s"] for x in s]),
                 ("vLLM engine, snapshot: CPU GEMM re-pack", [x["gemm_repack_s"] for x in s]),
                 ("vLLM engine, snapshot end to end", [x["end_to_end_s"] for x in s])]
    loads = r["loads"] + (v["loads"] if v else [])
    lines = [f"where the time goes, {r['size']} ({gb:.3f} GB), {len(r['broadcast'])} runs, load average "
             f"{min(loads):.1f}–{max(loads):.1f}:", "| phase | s, median (range) | GB/s |", "|---|---|---|"]
    lines += [f"| {name} | {_med(xs)} | {gb / statistics.median(xs):.2f} |" for name, xs in rows]
    return "\n".join(lines)


async def amain(args) -> None:
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="bcast-bench-"))
    print(f"receiver: one process, transformers model; gloo on loopback; buckets {args.bucket_mb} MiB; "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for size in args.sizes.split(","):
        r = await run_size(size, args, work)
        results.append(r)
        print(rounds(r) + "\n\n" + where_the_time_goes(r) + "\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="tiny,0.5b")
    p.add_argument("--runs", "--repeats", dest="runs", type=int, default=2)
    p.add_argument("--bucket-mb", type=int, default=64)
    p.add_argument("--json", default=None)
    p.add_argument("--no-snapshot", action="store_true", help="skip the snapshot rounds")
    p.add_argument("--vllm", default="", help="sizes whose publications also go into a vLLM CPU engine "
                                                "(`weight_broadcast_vllm.py`), e.g. 0.5b")
    args = p.parse_args()
    args.vllm = [x for x in args.vllm.split(",") if x]
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
