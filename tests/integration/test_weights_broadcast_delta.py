"""Deltas on the broadcast wire (the `broadcast` transport, gloo on loopback, a real Redis; two receiver
processes that follow the announcements as a rollout engine's worker does, keep a copy of the version
they hold, and catch up from the latest recovery snapshot when a version is refused).

The learner trains the broadcast test model (~10M parameters) for real — AdamW at lr 1e-6 on fp32
masters, published in bf16 — so each version changes a few percent of the published values:

- version 1 goes out full, version 2 as a delta; both receivers hold tensors bit-equal to the learner's;
- version 3: receiver B's copy has a flipped value → the delta's checksum of the resulting tensor fails,
  B refuses it and catches up from the snapshot of version 2; A applies it;
- version 4 goes out full (B holds no copy), reaching both;
- version 5: B's copy claims another version → B refuses the delta as out of order and catches up from
  the snapshot of version 4;
- version 6 full again; at the end both receivers hold exactly the learner's tensors of version 6.

Bytes on the wire per version (full and delta), the share of published values changed, the learner's
publish seconds and receiver A's receive seconds (with the delta applied and checked) are printed (`-s`)
with the load average."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from searchr1.streams import StreamKeys
from searchr1.weightsync import (
    Broadcaster,
    BroadcastTransport,
    DeltaSettings,
    VersionChain,
    WeightPublisher,
    checksums,
)
from searchr1.world.settings import ModelSettings
from tests.support.tiny_lm import build_tiny_lm

pytestmark = pytest.mark.asyncio
TIMEOUT_S = 20.0

_RECEIVER = textwrap.dedent("""
    import asyncio, json, sys, time
    from searchr1.streams import StreamKeys, connect
    from searchr1.weightsync import (Receiver, checksums, latest, latest_snapshot, parse_group_uri,
                                     read_verified, snapshot_tensors)

    async def main(url, run, timeout, tamper):
        redis, keys, seen = connect(url), StreamKeys(run), 0
        rx = Receiver(backend="gloo", timeout_s=timeout, keep_base=True)
        tamper = json.loads(tamper)
        await redis.ping()
        print(json.dumps({"ready": True}), flush=True)
        while True:
            wv = await latest(redis, keys)
            if wv is None or wv.version <= seen:
                await asyncio.sleep(0.02)
                continue
            seen = wv.version
            addr, v = parse_group_uri(wv.uri)
            if str(v) in tamper and rx.base is not None:
                how = tamper[str(v)]
                if how == "flip":  # values of the held copy flipped, in a tensor every step changes
                    name = next(n for n in sorted(rx.base.tensors) if "mlp.down_proj" in n)
                    rx.base.tensors[name].view(-1)[:64].neg_()
                else:  # the copy claims another version than it holds
                    rx.base.version = 10_000
            try:
                if rx.address != addr:
                    await asyncio.to_thread(rx.join, addr)
                t0 = time.perf_counter()
                engine = await asyncio.to_thread(lambda: {n: t.clone() for n, t in rx.receive(v)})
                out = {"version": v, "form": rx.last_form, "seconds": time.perf_counter() - t0}
            except Exception as exc:
                snap = await latest_snapshot(redis, keys)
                files = await asyncio.to_thread(read_verified, snap.uri, snap.sha256)
                engine = {n: t.clone() for n, t in snapshot_tensors(files)}
                out = {"version": v, "refused": type(exc).__name__, "why": str(exc), "caught_up": snap.version}
            out["sums"] = checksums(engine)
            print(json.dumps(out), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]))
""")


class Follower:
    """A receiver process and the JSON lines it printed."""

    def __init__(self, url: str, run: str, tamper: dict[int, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _RECEIVER, url, run, str(TIMEOUT_S), json.dumps(tamper)],
                                     stdout=subprocess.PIPE, text=True)
        self.lines: list[dict] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            doc = json.loads(raw)
            self.lines.append(doc)
            if doc.get("ready"):
                self.ready.set()

    async def outcome(self, version: int) -> dict:
        for _ in range(int(60 / 0.05)):
            for doc in self.lines:
                if doc.get("version") == version:
                    return doc
            await asyncio.sleep(0.05)
        raise AssertionError(f"no outcome for version {version}: {self.lines}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def test_deltas_on_the_wire_reach_the_learners_bits_and_a_bad_one_is_refused_and_caught_up(
        redis, redis_server, tmp_path):
    from transformers import AutoModelForCausalLM

    shape = ModelSettings(hidden_size=512, intermediate_size=1024, num_layers=2, num_heads=8, num_kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(build_tiny_lm(tmp_path / "m", model=shape, vocab_size=16384),
                                                 dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    tokens = torch.randint(0, 16384, (4, 64), generator=torch.Generator().manual_seed(0))
    keys = StreamKeys("bdelta")
    bc = Broadcaster("127.0.0.1", 0, 3, backend="gloo", timeout_s=TIMEOUT_S)
    transport = BroadcastTransport(WeightPublisher(tmp_path / "weights", keep=3), bc, redis, keys,
                                   snapshot_every=2, chain=VersionChain(DeltaSettings()))
    a, b = Follower(redis_server.url, "bdelta", {}), Follower(redis_server.url, "bdelta", {3: "flip", 5: "claim"})
    figures: dict[int, dict[str, float]] = {}
    try:
        assert await asyncio.to_thread(a.ready.wait, 120) and await asyncio.to_thread(b.ready.wait, 120)
        for v in range(1, 7):
            if v > 1:  # one real training step on the fp32 masters
                model(input_ids=tokens, labels=tokens).loss.backward()
                opt.step()
                opt.zero_grad()
            published = {k: t.detach().to(torch.bfloat16) for k, t in model.state_dict().items()}
            t0 = time.perf_counter()
            await asyncio.wait_for(transport.publish(v, model, published), 4 * TIMEOUT_S)
            figures[v] = {**transport.figures, "seconds": time.perf_counter() - t0}
            sent = checksums({k: published[k] for k in transport.figures_sums})
            ra, rb = await a.outcome(v), await b.outcome(v)
            assert ra.get("refused") is None and ra["sums"] == sent, (v, ra.get("why"))
            if v in (3, 5):
                assert rb["refused"] == "DeltaRefused" and rb["caught_up"] == v - 1
                assert ("checksum" if v == 3 else "out of order") in rb["why"]
            else:
                assert rb.get("refused") is None and rb["sums"] == sent, (v, rb.get("why"))
                assert rb["form"] == ra["form"]
        forms = {v: "delta" if f["broadcast_delta"] else "full" for v, f in figures.items()}
        assert forms == {1: "full", 2: "delta", 3: "delta", 4: "full", 5: "delta", 6: "full"}
        assert transport.failures == 0
        full = figures[1]["broadcast_wire_bytes"]
        deltas = [figures[v]["broadcast_wire_bytes"] for v in (2, 3, 5)]
        print(f"\nbroadcast wire bytes per version (bf16, {figures[1]['published_values']:.0f} values; load "
              f"average {os.getloadavg()[0]:.1f}): "
              + "; ".join(f"v{v} {forms[v]} {f['broadcast_wire_bytes'] / 1e6:.2f} MB"
                          + (f" ({f['published_changed_frac']:.1%} changed)" if "published_changed_frac" in f else "")
                          + f", learner {f['seconds']:.2f} s (snapshot included: {v % 2 == 0}), receiver A "
                            f"{a.lines[[d.get('version') for d in a.lines].index(v)]['seconds']:.2f} s"
                          for v, f in figures.items())
              + f"; full / delta {full / max(deltas):.1f}–{full / min(deltas):.1f}×")
        assert max(deltas) * 4 <= full
    finally:
        for r in (a, b):
            r.stop()
        transport.close()
