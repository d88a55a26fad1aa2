"""No worker blocks the learner or the other workers on the pull path (versions pulled over the learner's
HTTP weight server, full every 3rd, deltas between; a real Redis):

- two downloaders (separate processes) start pulling the full snapshot and stop mid-transfer — one is
  SIGKILLed, the other SIGSTOPped and left stopped — while the learner publishes four more versions and a
  healthy worker loads each of them;
- then a worker that joins late catches up (the newest full and the deltas after it).

The learner's publish of each version and the healthy worker's reload are timed before and while the
downloaders hang, and the late worker's catch-up; the figures are printed (`-s`). The property asserted:
every publication and every reload completes, each within a bound far below a stall (a blocked learner
or worker would hit the `asyncio.wait_for` bound), and the late worker ends on the newest version with its
weights equal to it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from searchr1.core.servers import HttpServer
from searchr1.rollout.hf_engine import HfGenerator
from searchr1.streams import StreamKeys
from searchr1.weightsync import (
    DeltaSettings,
    SnapshotTransport,
    VersionChain,
    WeightLoader,
    WeightPublisher,
    weights_app,
)
from searchr1.world.settings import ModelSettings
from tests.support.delta_versions import Versions
from tests.support.tiny_lm import build_tiny_lm

KEYS = StreamKeys("noblock")
BOUND_S = 60.0
"""Far above what a publication or a reload of this model takes on a loaded machine; a stall hits it."""

_STALLED = textwrap.dedent("""
    import sys, time, httpx
    with httpx.Client(timeout=None) as c, c.stream("GET", sys.argv[1]) as r:
        it = r.iter_raw(1 << 16)
        next(it)
        print("mid-transfer", flush=True)
        time.sleep(3600)
""")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):  # ~20 MB in bf16: more than a loopback socket buffers
    shape = ModelSettings(hidden_size=512, intermediate_size=1024, num_layers=2, num_heads=8, num_kv_heads=2)
    return build_tiny_lm(tmp_path_factory.mktemp("noblock") / "model", model=shape, vocab_size=16384)


def _downloader(url: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _STALLED, url], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "mid-transfer"
    return p


async def _timed(coro) -> float:
    t0 = time.perf_counter()
    await asyncio.wait_for(coro, BOUND_S)
    return time.perf_counter() - t0


async def test_dead_and_stopped_downloads_block_nobody(redis, model_dir, tmp_path):
    versions = Versions.of(model_dir)
    pub = WeightPublisher(tmp_path / "weights", keep=2)
    server = HttpServer(weights_app(pub), "127.0.0.1", 0)
    await server.start()
    killed = stopped = None
    try:
        pub.base_url = f"http://127.0.0.1:{server.port}"
        transport = SnapshotTransport(pub, redis, KEYS, chain=VersionChain(DeltaSettings(full_every=3)))
        healthy = WeightLoader(redis, KEYS, HfGenerator(str(model_dir)), tmp_path / "healthy")
        figures: dict[str, list[float]] = {"publish_before": [], "reload_before": [], "publish_during": [],
                                           "reload_during": []}
        for v in range(3):
            figures["publish_before"].append(await _timed(versions.publish(transport, v)))
            if v:
                figures["reload_before"].append(await _timed(healthy.maybe_update()))
        url = f"{pub.base_url}/weights/0/files/model.safetensors"
        # the server runs on this loop: wait for the downloaders from a thread
        killed, stopped = await asyncio.to_thread(_downloader, url), await asyncio.to_thread(_downloader, url)
        os.kill(stopped.pid, signal.SIGSTOP)
        for v in range(3, 7):
            if v == 4:
                killed.kill()
                killed.wait(10)
            figures["publish_during"].append(await _timed(versions.publish(transport, v)))
            figures["reload_during"].append(await _timed(healthy.maybe_update()))
            assert healthy.version == v
        late_forms: list[str] = []
        late = WeightLoader(redis, KEYS, HfGenerator(str(model_dir)), tmp_path / "late", on_form=late_forms.append)
        catch_up = await _timed(late.maybe_update())
        assert late.version == 6 and late_forms == ["catch_up"]
        held = late.generator._model.state_dict()
        assert all(held[k].equal(t.float()) for k, t in versions.published[6].items())
        load = os.getloadavg()[0]
        print(f"\nno-block figures (s; load average {load:.1f}): "
              + "; ".join(f"{k} {', '.join(f'{x:.2f}' for x in xs)}" for k, xs in figures.items())
              + f"; late worker's catch-up (full 6) {catch_up:.2f}")
    finally:
        for p in (killed, stopped):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
        await server.stop()
