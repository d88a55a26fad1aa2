"""Weight sync against model size: publish (write + hash + announce), transfer, verify and reload, for the
shared-volume and HTTP transports (docs/architecture.md, "Weight sync"; docs/performance.md, "Weight sync").

    .venv/bin/python benchmarks/weight_sync.py [--sizes tiny,0.5b,1.5b] [--transports volume,http]
                                               [--variants before,after] [--vllm-sizes tiny] [--json out.json]
                                               [--floors] [--runs N]

Models: the tiny world's shape (float32, as the world trains it) and random-initialised Qwen2 models with
Qwen2.5-0.5B and Qwen2.5-1.5B shapes (bfloat16, tied embeddings). Each size is published once per variant
with the learner's `WeightPublisher.write` (an HF `save_pretrained` directory), announced on a real Redis,
then fetched by each transport:

- volume: the rollout pins the snapshot on the shared directory (`fetch_snapshot` on a path: hard links
  and the manifest checked; phase `transfer`);
- http: the learner's file server (`weights_app`, in its own process, on loopback) serves it and the
  rollout downloads it with `fetch_snapshot` on the HTTP URI, every chunk checked as it arrives.

Reload: the tiny model is reloaded into a real vLLM CPU engine (`VllmGenerator.reload` with the digest,
the rollout's own path: `verify` is the engine's verified read, `reload` its `load_weights` and GEMM
re-pack); sizes not in `--vllm-sizes` are reloaded in place into one transformers model of the same
config kept for the run (every tensor copied into its parameter, as vLLM's `load_weights` does): the
`after` variant from the bytes `read_verified` returned (`verify`: the one read, every chunk checked),
the `before` variant from `safetensors.torch.load_file` after its sha256 pass (a vLLM CPU engine per
size does not fit a shared 24 GiB machine beside the training jobs).

Variants, same run, same snapshot bytes:
- before: the two-pass path: `save_pretrained`, then the digest in a second pass over the files (one
  sequential sha256), files served by Starlette's `FileResponse`, the download received on the event
  loop (each 1 MiB chunk written in a thread), then read back whole to verify it;
- after: `searchr1.weightsync` as it is: the publisher hashes chunks (BLAKE3) in parallel beside the
  write and writes the manifest; the reader verifies the chunks as it reads them for loading.

Memory: weights are bfloat16 for the large sizes; besides the receiver's model and the verified read's
buffer, at most two copies of a model's weights are alive at once (the previous `save_pretrained` write
makes a transient second one; the current writer streams), the learner's model is dropped before the last
round's reloads, every object is freed between sizes, and a size is skipped (and said so) when the kernel
reports less available memory than the copies it needs plus 1 GiB.

Prints, per size × variant × transport, wall seconds per phase, end-to-end GB/s (bytes / the sum of all
phases) and CPU seconds (this process's threads plus the file server's; a vLLM reload runs in the
engine's own process and is not counted); `--json` writes the same rows, per-phase CPU included. On a
shared machine wall times move with the neighbours' load: `--runs N` publishes each variant N times,
taking turns, and the closing table gives each phase's median and range over the runs with the load
average, the seconds per GB of each phase, and the 7B snapshot path modelled from them (`model_7b`).
`--floors` times the system's tools on the same file after each volume row (page-cache read,
`sha256sum`, a copy with and without `fdatasync`) and prints ours as a share of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `tests.support` when run as a script

# (hidden, intermediate, layers, heads, kv heads, vocab): Qwen2.5-0.5B / -1.5B config.json shapes
QWEN_SHAPES = {
    "0.5b": (896, 4864, 24, 14, 2, 151_936),
    "1.5b": (1536, 8960, 28, 12, 2, 151_936),
}
from benchmarks.weight_sync_report import PHASES  # noqa: E402


@dataclass
class Row:
    size: str
    variant: str
    transport: str
    params: int
    bytes: int
    seconds: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    server_cpu: dict[str, float] = field(default_factory=dict)
    reload_into: str = ""
    load: float = 0.0
    """1-minute load average when the row was taken."""

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def line(self) -> str:
        cells = "  ".join(f"{self.seconds.get(p, 0.0):7.3f}" for p in PHASES)
        cpu = sum(self.cpu.values())
        return (f"{self.size:<5} {self.variant:<6} {self.transport:<6} {self.bytes / 1e9:7.3f} GB  {cells}  "
                f"{self.total:7.3f}  {self.bytes / self.total / 1e9:6.3f} GB/s  cpu {cpu:7.2f} s  "
                f"({self.reload_into})")


HEADER = (f"{'size':<5} {'var':<6} {'trans':<6} {'bytes':>10}  "
          + "  ".join(f"{p:>7}" for p in PHASES) + f"  {'total':>7}  {'end-to-end':>11}  (wall s; cpu: all phases but a vLLM reload)")


# ---------------------------------------------------------------------------------------------- baseline
# The previous implementation, kept here so before and after run on the same bytes in the same run.

def before_digest(directory: Path) -> str:
    """sha256 over each file's relative path and bytes, sorted, one sequential pass."""
    from searchr1.weightsync import snapshot_files

    h = hashlib.sha256()
    for path in snapshot_files(directory):
        h.update(path.relative_to(directory).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


async def before_download(base: str, dest: Path) -> None:
    """Download every listed file into `dest` (1 MiB chunks, each written in a thread)."""
    import httpx

    dest.mkdir(parents=True)
    async with httpx.AsyncClient(timeout=600) as client:
        names = (await client.get(f"{base}/files")).raise_for_status().json()
        for name in names:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            f = (dest / name).open("wb")
            try:
                async with client.stream("GET", f"{base}/files/{name}") as r:
                    r.raise_for_status()
                    async for chunk in r.aiter_bytes(1 << 20):
                        await asyncio.to_thread(f.write, chunk)
            finally:
                f.close()


# ---------------------------------------------------------------------------------------------- models

def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def build_model(size: str, workdir: Path):
    """(model, engine_dir): the learner's model and, for the tiny size, a directory with its tokenizer
    for a vLLM engine to start from."""
    import torch

    if size == "tiny":
        from transformers import AutoModelForCausalLM

        from searchr1.world.settings import ModelSettings
        from tests.support.tiny_lm import build_tiny_lm

        engine_dir = build_tiny_lm(workdir / "engine", ModelSettings())
        return AutoModelForCausalLM.from_pretrained(engine_dir, dtype=torch.float32), engine_dir
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, inter, layers, heads, kv, vocab = QWEN_SHAPES[size]
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=True,
                      max_position_embeddings=4096, torch_dtype="bfloat16")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialise straight into bf16: no float32 copy ever exists
    try:
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.eval(), None


class InPlaceReceiver:
    """One transformers model of a snapshot's config, kept for the run: each reload copies every tensor
    into its parameter in place, as vLLM's `load_weights` does."""

    def __init__(self, config_dir: Path, dtype_name: str) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(config_dir)
        self.model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype_name)).eval()
        self.params = dict(self.model.state_dict())

    def copy_in(self, tensors) -> int:
        import torch

        n = 0
        with torch.no_grad():
            for name, t in tensors:
                self.params[name].copy_(t)
                n += 1
        return n


def load_before(path: Path):
    """The previous reader's tensors: `safetensors.torch.load_file` (a second read, after the sha256 pass)."""
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors")).items()


# ---------------------------------------------------------------------------------------------- serving

def before_app(root: Path):
    """The previous file server: the same routes, files sent by Starlette's `FileResponse` (64 KiB reads)."""
    from fastapi import FastAPI
    from fastapi.responses import FileResponse

    from searchr1.weightsync import snapshot_listing

    app = FastAPI()

    @app.get("/weights/{version}/files")
    def list_files(version: int) -> list[str]:
        return snapshot_listing(root / f"v{version:08d}")

    @app.get("/weights/{version}/files/{name:path}")
    def get_file(version: int, name: str) -> FileResponse:
        return FileResponse(root / f"v{version:08d}" / name)

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True}

    return app


def serve(root: str, port: int, variant: str) -> None:
    """The learner's weight file server over `root`, in this process (`--serve`)."""
    import uvicorn

    from searchr1.weightsync import WeightPublisher, weights_app

    app = before_app(Path(root)) if variant == "before" else weights_app(WeightPublisher(Path(root), keep=3))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class FileServer:
    def __init__(self, root: Path, variant: str) -> None:
        from searchr1.core.servers import free_port

        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(root), "--port", str(self.port),
                                      "--variant", variant])
        self.url = f"http://127.0.0.1:{self.port}"

    def cpu(self) -> float:
        """The server process's user + system CPU seconds so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait(self) -> None:
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weight file server exited with {self.proc.returncode}")
            try:
                httpx.get(f"{self.url}/healthz", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("weight file server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# ---------------------------------------------------------------------------------------------- one case

class Clock:
    """Wall and CPU seconds per phase; CPU is this process's (all threads) plus the file server's."""

    def __init__(self, row: Row, server: FileServer | None) -> None:
        self.row, self.server = row, server

    def server_cpu(self) -> float:
        return self.server.cpu() if self.server is not None else 0.0

    @contextlib.contextmanager
    def phase(self, name: str):
        w0, c0, s0 = time.perf_counter(), time.process_time(), self.server_cpu()
        try:
            yield
        finally:
            server = self.server_cpu() - s0
            self.row.seconds[name] = self.row.seconds.get(name, 0.0) + time.perf_counter() - w0
            self.row.cpu[name] = self.row.cpu.get(name, 0.0) + time.process_time() - c0 + server
            self.row.server_cpu[name] = self.row.server_cpu.get(name, 0.0) + server


async def publish(variant: str, publisher, version: int, model, clock: Clock) -> tuple[Path, str]:
    """Write and digest one snapshot the `variant` way."""
    with clock.phase("write"):
        state = model.state_dict()
        if variant == "before":
            path = publisher.path(version)
            await asyncio.to_thread(model.save_pretrained, path, state_dict=state, safe_serialization=True)
        else:
            path = await asyncio.to_thread(publisher.write, version, model, state)
        del state
    with clock.phase("hash"):
        digest = await asyncio.to_thread(before_digest if variant == "before" else publisher.digest,
                                         path if variant == "before" else version)
    return path, digest


async def receive(variant: str, wv, path: Path, dl: Path, transport: str, clock: Clock) -> Path:
    """Transfer (HTTP) or pin (volume) one announced snapshot the `variant` way; returns the local copy.
    The `before` variant verifies here (a sha256 pass); `after` verifies as the reload reads (`reload`)."""
    from searchr1.weightsync import fetch_snapshot

    if variant == "before":
        got = path
        if transport == "http":
            got = dl / f"v{wv.version:08d}"
            with clock.phase("transfer"):
                await before_download(wv.uri, got)
        with clock.phase("verify"):
            if await asyncio.to_thread(before_digest, got) != wv.sha256:
                raise RuntimeError("digest mismatch")
        return got
    with clock.phase("transfer"):  # HTTP: every chunk checked as it arrives; volume: links + the manifest
        return await fetch_snapshot(wv, dl)


async def reload(variant: str, wv, got: Path, engine, receiver: InPlaceReceiver | None, clock: Clock) -> None:
    """Load the received snapshot the `variant` way: `after` reads it verified (`verify`) and loads those
    bytes (`reload`); `before` loads the files it verified earlier."""
    from searchr1.weightsync import read_verified, snapshot_tensors

    if engine is not None:
        with clock.phase("reload"):
            await engine.reload(str(got), wv.sha256 if variant == "after" else None)
        read = engine.last_load_times.get("read_verify_s", 0.0) if variant == "after" else 0.0
        clock.row.seconds["reload"] -= read
        clock.row.seconds["verify"] = clock.row.seconds.get("verify", 0.0) + read
        return
    assert receiver is not None
    if variant == "before":
        with clock.phase("reload"):
            await asyncio.to_thread(lambda: receiver.copy_in(load_before(got)))
        return
    with clock.phase("verify"):
        files = await asyncio.to_thread(read_verified, got, wv.sha256)
    with clock.phase("reload"):
        await asyncio.to_thread(receiver.copy_in, snapshot_tensors(files))
    del files


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def floors(path: Path) -> dict[str, float]:
    """The same snapshot's bytes through the system's own tools, right after it is written (GB/s): read from
    the page cache (`dd` to /dev/null), `sha256sum`, a copy into a new file without and with `fdatasync`
    (`dd`, 64 MiB blocks)."""
    from searchr1.weightsync import snapshot_files

    files = [f for f in snapshot_files(path) if f.suffix == ".safetensors"]
    n = sum(f.stat().st_size for f in files)
    out = path.parent / "floor-copy"
    rates = {}
    rates["read"] = n / sum(_timed(["dd", f"if={f}", "of=/dev/null", "bs=64M"]) for f in files)
    rates["sha256sum"] = n / _timed(["sha256sum", *map(str, files)])
    rates["write"] = n / sum(_timed(["dd", f"if={f}", f"of={out}", "bs=64M"]) for f in files)
    rates["write_fsync"] = n / sum(_timed(["dd", f"if={f}", f"of={out}", "bs=64M", "conv=fdatasync"]) for f in files)
    out.unlink(missing_ok=True)
    return {k: v / 1e9 for k, v in rates.items()}


def floor_line(row: Row, f: dict[str, float]) -> str:
    """Ours per phase (GB/s) against the floors of the same file, in the same round."""
    gb = row.bytes / 1e9
    publish = gb / max(row.seconds.get("write", 0.0) + row.seconds.get("hash", 0.0), 1e-9)
    verify = gb / max(row.seconds.get("verify", 0.0), 1e-9)
    return (f"  floors (GB/s): page-cache read {f['read']:.2f}, sha256sum {f['sha256sum']:.2f}, write "
            f"{f['write']:.2f}, write+fdatasync {f['write_fsync']:.2f} | ours: publish (write + digest, no fsync) "
            f"{publish:.2f} = {publish / f['write']:.0%} of the write floor, verify (the read, digests checked) "
            f"{verify:.2f} = {verify / f['read']:.0%} of the page-cache read, {verify / f['sha256sum']:.0%} of "
            f"sha256sum | load {os.getloadavg()[0]:.1f}")


async def run_size(size: str, args, redis, workdir: Path, engine_factory) -> list[Row]:
    from searchr1.core.schemas import WeightVersion
    from searchr1.streams import StreamKeys
    from searchr1.weightsync import WeightPublisher, announce, snapshot_files

    keys = StreamKeys(f"bench-{size}")
    model, engine_dir = await asyncio.to_thread(build_model, size, workdir)
    params = sum(p.numel() for p in model.parameters())
    dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
    engine = await engine_factory(engine_dir) if engine_dir is not None and size in args.vllm_sizes else None
    receiver = None
    if engine is None:
        model.config.save_pretrained(workdir / "receiver-config")
        receiver = await asyncio.to_thread(InPlaceReceiver, workdir / "receiver-config", dtype_name)
    publisher = WeightPublisher(workdir / "weights", keep=1)
    servers = {v: FileServer(publisher.root, v) for v in args.variants} if "http" in args.transports else {}
    rows: list[Row] = []
    version = 0
    try:
        for server in servers.values():
            server.wait()
        for r in range(args.runs):
            # publish every variant, then (last round) drop the learner's model before any reload, so
            # at most two copies of the weights are alive: save_pretrained's transient one, or a reload's
            published = []
            for variant in (args.variants if r % 2 == 0 else args.variants[::-1]):  # take turns
                version += 1
                pub = Row(size, variant, "", params, 0)
                path, digest = await publish(variant, publisher, version, model, Clock(pub, servers.get(variant)))
                pub.bytes = sum(p.stat().st_size for p in snapshot_files(path))
                published.append((variant, version, path, digest, pub))
            if r == args.runs - 1:
                model = None
                gc.collect()
            for variant, version, path, digest, pub in published:
                server = servers.get(variant)
                for transport in args.transports:
                    uri = f"{server.url}/weights/{version}" if transport == "http" else str(path)
                    wv = WeightVersion(version=version, uri=uri, sha256=digest)
                    row = Row(size, variant, transport, params, pub.bytes, dict(pub.seconds), dict(pub.cpu),
                              dict(pub.server_cpu))
                    clock = Clock(row, server)
                    with clock.phase("announce"):
                        await announce(redis, keys, wv)
                    dl = workdir / f"download-{variant}-{transport}"
                    got = await receive(variant, wv, path, dl, transport, clock)
                    await reload(variant, wv, got, engine, receiver, clock)
                    row.reload_into = "vLLM CPU engine" if engine is not None else f"transformers, {dtype_name}"
                    row.load = os.getloadavg()[0]
                    for p in PHASES:
                        row.seconds.setdefault(p, 0.0)
                        row.cpu.setdefault(p, 0.0)
                    print(row.line(), flush=True)
                    if args.floors and transport == "volume":
                        print(floor_line(row, await asyncio.to_thread(floors, path)), flush=True)
                    rows.append(row)
                    await asyncio.to_thread(shutil.rmtree, dl, True)
                await asyncio.to_thread(shutil.rmtree, path, True)
    finally:
        for server in servers.values():
            server.stop()
        if engine is not None:
            await engine.close()
        del model, receiver
        gc.collect()
    return rows


async def start_vllm(engine_dir: Path):
    from searchr1.rollout.settings import EngineSettings
    from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on the CPU build
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return await VllmGenerator.start(VllmEngineConfig(model=str(engine_dir), engine=EngineSettings(
        gpu_memory_utilization=0.05, max_model_len=1024, dtype="float32", max_num_seqs=8)))


SIZE_BYTES = {"tiny": 0, "0.5b": 494_032_768 * 2, "1.5b": 1_543_714_304 * 2}
"""Weight bytes of each size (bf16), for the memory check before it is built."""


async def amain(args) -> list[Row]:
    from searchr1.core.redis_server import RedisServer
    from searchr1.streams import connect

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="searchr1-wsync-", dir=args.workdir) as tmp, \
            RedisServer(workdir=Path(tmp) / "redis") as server:
        redis = connect(server.url)
        try:
            print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
                  f"phases in seconds", flush=True)
            print(HEADER, flush=True)
            for size in args.sizes:
                # two copies when the previous writer runs (its transient one) or the model outlives a reload
                # the in-place receiver's model and the verified read's buffer: two more
                copies = (2 if "before" in args.variants or args.runs > 1 else 1) + 2
                need = copies * SIZE_BYTES[size] + 2**30
                have = available_bytes()
                print(f"{size}: {have / 2**30:.1f} GiB available, {need / 2**30:.1f} GiB needed", flush=True)
                if need > have:
                    print(f"{size}: skipped ({copies} cop{'ies' if copies > 1 else 'y'} of its weights + 1 GiB do not fit)",
                          flush=True)
                    continue
                rows += await run_size(size, args, redis, Path(tmp) / size, start_vllm)
                gc.collect()
        finally:
            await redis.aclose()
    print(f"load average after: {os.getloadavg()[0]:.1f}", flush=True)
    if rows:
        from benchmarks.weight_sync_report import model_7b, summary

        print("\n" + summary(rows) + "\n\n" + model_7b(rows), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="tiny,0.5b,1.5b")
    ap.add_argument("--transports", default="volume,http")
    ap.add_argument("--variants", default="before,after")
    ap.add_argument("--vllm-sizes", default="tiny", help="sizes reloaded into a vLLM CPU engine (tiny only)")
    ap.add_argument("--workdir", default=None, help="where snapshots are written (default: the temp dir)")
    ap.add_argument("--runs", "--repeats", dest="runs", type=int, default=1,
                    help="publications per variant (variants take turns); the closing table gives medians and ranges")
    ap.add_argument("--json", default=None, help="write the rows here as JSON")
    ap.add_argument("--floors", action="store_true",
                    help="after each volume row, time dd/sha256sum/fdatasync on the same file (the floors)")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="after", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.variant)
        return
    for name in ("sizes", "transports", "variants", "vllm_sizes"):
        setattr(args, name, [x for x in getattr(args, name).split(",") if x])
    bad = [s for s in args.sizes if s not in SIZE_BYTES] + [t for t in args.transports if t not in ("volume", "http")]
    bad += [v for v in args.variants if v not in ("before", "after")]
    if bad:
        ap.error(f"unknown size/transport/variant: {bad}")
    rows = asyncio.run(amain(args))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) | {"total": r.total} for r in rows], indent=1))


if __name__ == "__main__":
    main()
