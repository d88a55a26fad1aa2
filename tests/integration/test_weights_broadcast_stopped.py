"""A receiver SIGSTOPped during a broadcast (the `broadcast` transport, gloo, a real Redis; the receivers are
processes that follow the announcements as a rollout engine's worker does, and catch up from the recovery
snapshot when a receive fails):

- version 1 reaches both receivers;
- version 2: one receiver is SIGSTOPped inside the group before the tensors flow. The learner's send
  fails within its timeout (it does not hang), the version is written as a recovery snapshot and training
  goes on; the other receiver's receive fails and it catches up from that snapshot;
- version 3, the stopped receiver still stopped: the next generation forms with the receiver that joined
  within the join window, and the version reaches it;
- version 4, still stopped: a healthy send to the one receiver of that generation;
- the stopped receiver is killed and a new one starts: the generation it finds announced is closed, so it
  catches up from the latest snapshot and waits; version 5 opens a generation both receivers join and
  reaches both, and version 6 is a healthy send again.

The learner's publish seconds per version and each receiver's outcome are printed (`-s`). The figures this
test pins: only the version in flight when the receiver stops costs the learner `timeout_s` (+ the
recovery snapshot); the next costs the join window + a send, and the ones after that a healthy send — the
pull path (snapshots and deltas) costs it nothing (`test_weights_no_block.py`)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from searchr1.streams import StreamKeys
from searchr1.weightsync import Broadcaster, BroadcastTransport, WeightPublisher
from searchr1.world.settings import ModelSettings
from tests.support.tiny_lm import build_tiny_lm

pytestmark = pytest.mark.asyncio
TIMEOUT_S = 4.0
JOIN_WINDOW_S = 1.0

_RECEIVER = textwrap.dedent("""
    import asyncio, sys, time
    from searchr1.streams import StreamKeys, connect
    from searchr1.weightsync import Receiver, latest, latest_snapshot, parse_group_uri, read_verified

    async def main(url, run, timeout):
        redis, keys, rx, seen = connect(url), StreamKeys(run), Receiver(backend="gloo", timeout_s=timeout), 0
        import torch.distributed  # noqa: F401 - loaded before the first announcement
        await redis.ping()
        print("ready", flush=True)
        while True:
            wv = await latest(redis, keys)
            if wv is None or wv.version <= seen:
                await asyncio.sleep(0.02)
                continue
            seen = wv.version
            addr, v = parse_group_uri(wv.uri)
            t0 = time.perf_counter()
            try:
                if rx.address != addr:
                    await asyncio.to_thread(rx.join, addr)
                print(f"joined {v}", flush=True)
                await asyncio.to_thread(lambda: sum(t.numel() for _, t in rx.receive(v)))
                print(f"received {v} {time.perf_counter() - t0:.2f}", flush=True)
            except Exception as exc:
                refused = "closed" in str(exc) or "full" in str(exc)  # not in this generation: the latest
                snap = await latest_snapshot(redis, keys)
                while not refused and (snap is None or snap.version < v):  # written once the send failed
                    await asyncio.sleep(0.02)
                    snap = await latest_snapshot(redis, keys)
                await asyncio.to_thread(read_verified, snap.uri, snap.sha256)
                print(f"caught_up {snap.version} {time.perf_counter() - t0:.2f} {type(exc).__name__}", flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
""")


class Receiver:
    """A receiver process and the lines it printed."""

    def __init__(self, url: str, run: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _RECEIVER, url, run, str(TIMEOUT_S)],
                                     stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.joined, self.ready = threading.Event(), threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.strip())
            if raw.startswith("joined"):
                self.joined.set()
            if raw.startswith("ready"):
                self.ready.set()

    async def outcome(self, version: int) -> str:
        for _ in range(int(60 / 0.05)):
            for ln in self.lines:
                if ln.split()[0] in ("received", "caught_up") and int(ln.split()[1]) >= version:
                    return ln
            await asyncio.sleep(0.05)
        raise AssertionError(f"no outcome for version {version}: {self.lines}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def test_a_stopped_receiver_costs_the_learner_one_timeout_and_nobody_hangs(redis, redis_server, tmp_path):
    from transformers import AutoModelForCausalLM

    shape = ModelSettings(hidden_size=512, intermediate_size=1024, num_layers=2, num_heads=8, num_kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(build_tiny_lm(tmp_path / "m", model=shape, vocab_size=16384),
                                                 dtype=torch.float32)  # ~40 MB: more than sockets buffer
    state = model.state_dict()
    keys = StreamKeys("bstop")
    bc = Broadcaster("127.0.0.1", 0, 3, backend="gloo", timeout_s=TIMEOUT_S, join_window_s=JOIN_WINDOW_S)
    transport = BroadcastTransport(WeightPublisher(tmp_path / "weights", keep=2), bc, redis, keys,
                                   snapshot_every=1000)
    a, b = Receiver(redis_server.url, "bstop"), Receiver(redis_server.url, "bstop")
    late = None
    seconds: dict[int, float] = {}

    async def publish(v: int) -> None:
        t0 = time.perf_counter()
        await asyncio.wait_for(transport.publish(v, model, state), 4 * TIMEOUT_S + 30)
        seconds[v] = time.perf_counter() - t0

    try:
        assert await asyncio.to_thread(a.ready.wait, 120) and await asyncio.to_thread(b.ready.wait, 120)
        await publish(1)
        assert (await a.outcome(1)).startswith("received 1") and (await b.outcome(1)).startswith("received 1")
        b.joined.clear()
        task = asyncio.create_task(publish(2))
        assert await asyncio.to_thread(b.joined.wait, 30)
        os.kill(b.proc.pid, signal.SIGSTOP)  # in the group, before the tensors flow
        await task
        assert transport.failures == 1 and seconds[2] >= TIMEOUT_S
        assert (await a.outcome(2)).startswith("caught_up 2")
        await publish(3)  # still stopped: the next generation forms with the receiver that joined
        assert transport.failures == 1 and bc.members == 1 and (await a.outcome(3)).startswith("received 3")
        await publish(4)  # still stopped: a healthy send
        assert transport.failures == 1 and (await a.outcome(4)).startswith("received 4")
        b.stop()
        late = Receiver(redis_server.url, "bstop")
        assert await asyncio.to_thread(late.ready.wait, 120)
        # the late receiver finds version 4 announced for a closed generation: it catches up from the
        # latest snapshot (version 2) and waits for the next generation
        assert (await late.outcome(2)).startswith("caught_up 2")
        await publish(5)
        await publish(6)
        assert transport.failures == 1 and bc.members == 2
        for v in (5, 6):
            assert (await a.outcome(v)).startswith(f"received {v}")
            assert (await late.outcome(v)).startswith(f"received {v}")
        print(f"\nbroadcast, a receiver SIGSTOPped (timeout_s {TIMEOUT_S}, join_window_s {JOIN_WINDOW_S}; load "
              f"average {os.getloadavg()[0]:.1f}): learner publish s "
              f"{', '.join(f'v{v} {s:.2f}' for v, s in sorted(seconds.items()))}; live receiver "
              f"{a.lines}; late receiver {late.lines}")
        assert seconds[3] < TIMEOUT_S  # the join window and a send, not another timeout
        assert max(seconds[4], seconds[6]) < TIMEOUT_S / 2  # a healthy send
    finally:
        for r in (a, b, late):
            if r is not None:
                if r.proc.poll() is None:
                    os.kill(r.proc.pid, signal.SIGCONT)
                r.stop()
        transport.close()
