"""A receiver SIGSTOPped during a broadcast, resumed, then killed, and a late one (the `broadcast`
transport, gloo, a real Redis; the receivers are processes that follow the announcements as a rollout
engine's worker does, and catch up from the latest recovery snapshot when a receive fails):

- version 1 reaches both receivers;
- version 2: receiver B is SIGSTOPped inside the group before the tensors flow. The learner's send
  fails within its timeout (it does not hang), the version is written as a recovery snapshot and training
  goes on; receiver A's receive fails and it catches up from that snapshot;
- version 3, B still stopped: the next generation forms with the receiver that joined within the join
  window (A), and the version reaches it; version 4: a healthy send to A;
- B is resumed (SIGCONT): its receive of version 2 fails, it catches up from the snapshot, finds the
  generation of version 4 closed and waits; version 5 opens a generation both join, version 6 reaches both;
- B is killed and a new receiver starts: the generation is full, so the newcomer catches up from the
  snapshot and waits; version 7 fails on the dead member (at once: its connection is closed, where a
  stopped one holds it open until the timeout) and version 8 forms with A and the newcomer within the
  join window.

The learner's publish seconds per version and each receiver's outcome are printed (`-s`). The figures this
test pins: a receiver that stops costs the learner `timeout_s` (+ the recovery snapshot) for the version
in flight only (one that dies, less), the next one the join window and a send, the ones after a healthy
send — the
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
                refused = "weight group generation" in str(exc)  # closed or full: the latest snapshot
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

    async def new_lines(self, since: int, count: int) -> list[str]:
        """The `count` lines printed after the first `since` (waits for them)."""
        for _ in range(int(60 / 0.05)):
            if len(self.lines) >= since + count:
                return self.lines[since:since + count]
            await asyncio.sleep(0.05)
        raise AssertionError(f"fewer than {count} lines after line {since}: {self.lines}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def test_a_stopped_or_dead_receiver_costs_the_learner_one_timeout_and_nobody_hangs(redis, redis_server, tmp_path):
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

        seen = len(b.lines)
        os.kill(b.proc.pid, signal.SIGCONT)  # back: catches up, is refused by the closed generation, waits
        back = await b.new_lines(seen, 2)  # version 2's receive failed; version 4's generation was closed
        assert all(ln.startswith("caught_up 2") for ln in back), back
        await publish(5)
        await publish(6)
        assert transport.failures == 1 and bc.members == 2
        for v in (5, 6):
            for r in (a, b):
                assert (await r.outcome(v)).startswith(f"received {v}")

        b.stop()  # dies between versions; a newcomer finds the generation full, catches up and waits
        late = Receiver(redis_server.url, "bstop")
        assert await asyncio.to_thread(late.ready.wait, 120)
        assert (await late.new_lines(1, 1))[0].startswith("caught_up 2")  # after its "ready"
        await publish(7)  # the dead member fails the version in flight: at once, its connection closed
        assert transport.failures == 2 and seconds[7] < TIMEOUT_S + 2
        await publish(8)
        assert transport.failures == 2 and bc.members == 2
        assert (await a.outcome(8)).startswith("received 8") and (await late.outcome(8)).startswith("received 8")
        print(f"\nbroadcast, a receiver SIGSTOPped, resumed, killed, a late one (timeout_s {TIMEOUT_S}, join_window_s "
              f"{JOIN_WINDOW_S}; load average {os.getloadavg()[0]:.1f}): learner publish s "
              f"{', '.join(f'v{v} {s:.2f}' for v, s in sorted(seconds.items()))}; receiver A {a.lines}; "
              f"receiver B {b.lines}; late receiver {late.lines}")
        assert seconds[3] < TIMEOUT_S and seconds[8] < TIMEOUT_S  # the join window and a send, not a timeout
        assert max(seconds[4], seconds[6]) < TIMEOUT_S / 2  # healthy sends
    finally:
        for r in (a, b, late):
            if r is not None:
                if r.proc.poll() is None:
                    os.kill(r.proc.pid, signal.SIGCONT)
                r.stop()
        transport.close()
