"""Full and delta weight versions over NCCL against a bare broadcast of the same bytes (docs/performance.md,
"Weight deltas"; needs GPUs: not run on the CPU test machine).

    .venv/bin/python benchmarks/weight_broadcast_nccl.py [--gb 1.0] [--density 0.01] [--receivers 1,2] [--runs 3]

NCCL takes one GPU per rank: the learner is rank 0 on cuda:0 and each receiver a process on its own GPU
(cuda:1, cuda:2, ...), so one receiver needs two GPUs and two receivers three; with fewer the script says
so and exits 2. Synthetic bf16 tensors of `--gb` (the 0.5B model's size by default) are published as
version 1, then version 2 with `--density` of the values changed (`VersionChain` with `weights.delta`'s
defaults encodes the delta: positions and values, zstd). Per receiver count, the same process group:

- *full*: `Broadcaster.send` of version 1 (the whole version, bucketed, hashed on both sides; the
  receivers keep their host copy for the next delta);
- *delta*: `Broadcaster.send` of version 2 as the delta (its bytes on the wire, applied to the receivers'
  copies with every resulting tensor's checksum verified);
- *bare full* / *bare delta*: one `broadcast` of a uint8 tensor of the same bytes as each, nothing else.

Prints each row's wall seconds (median of `--runs`, after one warm-up round), the bytes on the wire and
the share of the bare broadcast's time (bare / path). The contents alternate between the two states, so
every version is a delta of the same density against the one before, which the receivers hold.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RECEIVER = r"""
import sys, time, torch
from searchr1.weightsync import Receiver, parse_group_uri
from searchr1.weightsync.broadcast import broadcast_tensor
device = sys.argv[1]
rx = Receiver(backend="gloo" if device == "cpu" else "nccl", timeout_s=300, device=device, keep_base=True)
sync = (lambda: torch.cuda.synchronize(device)) if device != "cpu" else (lambda: None)
print("ready", flush=True)
for line in sys.stdin:
    kind, arg = line.split()
    t0 = time.perf_counter()
    if kind == "bare":
        buf = torch.empty(int(arg), dtype=torch.uint8, device=device)
        broadcast_tensor(rx._pg, buf)
        sync()
        form = "bare"
    else:
        addr, version = parse_group_uri(arg)
        if rx.address != addr:
            rx.join(addr)
        for _ in rx.receive(version):
            pass
        sync()
        form = rx.last_form
    print("done", form, f"{time.perf_counter() - t0:.4f}", flush=True)
"""


class ReceiverProc:
    def __init__(self, device: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / ".shim"), *sys.path])}
        self.p = subprocess.Popen([sys.executable, "-c", _RECEIVER, device], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout is not None and self.p.stdout.readline().strip() == "ready"

    def ask(self, kind: str, arg: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(f"{kind} {arg}\n")
        self.p.stdin.flush()

    def wait(self) -> tuple[str, float]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline().split()
        if not line or line[0] != "done":
            raise RuntimeError(f"receiver failed: {line}")
        return line[1], float(line[2])

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait(60)


def versions(gb: float, density: float):
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    n_tensors = 24
    per = int(gb * 1e9 / 2 / n_tensors)
    v1 = {f"layer.{i:02d}.weight": (torch.randn(per, generator=g) * 0.02).to(torch.bfloat16) for i in range(n_tensors)}
    v2 = {}
    for name, t in v1.items():
        nxt = t.clone()
        pos = torch.randperm(per, generator=g)[: int(per * density)]
        nxt[pos] = (nxt[pos].float() + 1e-2).to(torch.bfloat16)
        v2[name] = nxt
    return v1, v2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--receivers", default="1,2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                    help="gloo: the same rounds on CPU (a dry run of the script, not the comparison)")
    args = ap.parse_args()
    import torch

    from searchr1.weightsync import Broadcaster, DeltaSettings, VersionChain, WireDelta
    from searchr1.weightsync.safetensors import safetensors_bytes

    counts = [int(x) for x in args.receivers.split(",")]
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu = args.backend == "nccl"
    if gpu and have < max(counts) + 1:
        print(f"error: NCCL needs one GPU per rank: {max(counts) + 1} GPUs for {max(counts)} receivers, "
              f"{have} visible", file=sys.stderr)
        return 2
    v1, v2 = versions(args.gb, args.density)
    contents = {1: v1, 0: v2}
    dev0 = "cuda:0" if gpu else "cpu"
    on_gpu = {k: sorted((name, t.to(dev0)) for name, t in s.items()) for k, s in contents.items()}
    chain = VersionChain(DeltaSettings(max_share=0.9))
    from searchr1.weightsync.broadcast import broadcast_tensor

    for n in counts:
        bc = Broadcaster("127.0.0.1", 0, n + 1, backend=args.backend, timeout_s=300)
        rxs = [ReceiverProc(f"cuda:{i + 1}" if gpu else "cpu") for i in range(n)]
        rows: dict[str, list[float]] = {}
        sizes: dict[str, int] = {}
        version = 0
        try:
            for run in range(args.runs + 1):  # the first round warms the group up
                for form in ("full", "delta"):
                    version += 1  # contents alternate, so every version differs from the one before
                    plan = chain.plan(version, contents[version % 2])  # outside the timed part
                    delta = None
                    if form == "delta" and plan.delta is not None and plan.base is not None:
                        delta = WireDelta(plan.base, safetensors_bytes(plan.delta, plan.delta_metadata))
                    for rx in rxs:
                        rx.ask("recv", bc.uri(version))
                    t0 = time.perf_counter()
                    bc.send(version, on_gpu[version % 2], sums=plan.sums, delta=delta)
                    got = [rx.wait() for rx in rxs]
                    dt = time.perf_counter() - t0
                    if any(g[0] != bc.last_form for g in got) or bc.last_form != (form if version > 1 else "full"):
                        raise RuntimeError(f"receivers got {got}, sent {bc.last_form}, meant {form}")
                    sizes[bc.last_form] = bc.last_bytes
                    if run:
                        rows.setdefault(form, []).append(dt)
                for form in ("full", "delta"):
                    nbytes = sizes.get(form, 0)
                    if not nbytes:
                        continue
                    for rx in rxs:
                        rx.ask("bare", str(nbytes))
                    t0 = time.perf_counter()
                    broadcast_tensor(bc._pg, torch.empty(nbytes, dtype=torch.uint8, device=dev0))
                    if gpu:
                        torch.cuda.synchronize(0)
                    for rx in rxs:
                        rx.wait()
                    if run:
                        rows.setdefault(f"bare {form}", []).append(time.perf_counter() - t0)
        finally:
            for rx in rxs:
                rx.close()
            bc.close()
        if n == counts[0]:
            print(f"{args.gb:.2f} GB bf16, density {plan.figures.get('published_changed_frac', 0):.2%}, "
                  f"device {torch.cuda.get_device_name(0) if gpu else 'cpu (gloo)'}")
        for form in ("full", "delta"):
            path, bare = statistics.median(rows[form]), statistics.median(rows[f"bare {form}"])
            print(f"{n} receiver(s) {form:5s}: {path:.3f} s for {sizes[form] / 1e6:.1f} MB; bare broadcast of the "
                  f"same bytes {bare:.3f} s ({bare / path:.0%} of the path's time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
