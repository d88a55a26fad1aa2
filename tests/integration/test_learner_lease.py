"""One learner per run: the Redis lease with its fencing token (`searchr1.streams.Lease`), the fenced weight
announcement (`searchr1.weightsync.announce`), and the learner's writers stopping once the lease is lost. Real Redis."""

from __future__ import annotations

import asyncio

import pytest
import torch
from torch import nn

from searchr1.core.schemas import WeightVersion
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState
from searchr1.streams import Lease, LeaseHeld, LeaseLost, StreamKeys
from searchr1.weightsync import FencedOff, announce, announced_fence, latest


async def test_a_second_holder_is_refused_with_the_holders_name(redis):
    first = Lease(redis, "r", holder="host-a:11/learner-0")
    assert await first.acquire() == 1
    with pytest.raises(LeaseHeld, match=r"host-a:11/learner-0 \(fencing token 1\)"):
        await Lease(redis, "r", holder="host-b:22/learner-0").acquire()
    assert first.valid()


async def test_tokens_only_grow_across_holders(redis):
    tokens = []
    for holder in ("a", "b", "c"):
        lease = Lease(redis, "r", holder=holder)
        tokens.append(await lease.acquire())
        await lease.release()
    assert tokens == [1, 2, 3]
    assert await Lease(redis, "other-run").acquire() == 1


async def test_a_lease_taken_over_is_lost_and_every_check_raises(redis):
    lease = Lease(redis, "r", holder="a", ttl_ms=200)
    await lease.acquire()
    await redis.delete(lease.key)  # it expired (a long pause) and another learner took it
    assert await Lease(redis, "r", holder="b").acquire() == 2
    assert not await lease.renew()
    with pytest.raises(LeaseLost, match="no longer held"):
        lease.check()


async def test_a_lease_not_renewed_within_its_ttl_is_invalid_before_redis_frees_it(redis):
    lease = Lease(redis, "r", holder="a", ttl_ms=300)
    await lease.acquire()
    await asyncio.sleep(0.3 * 0.8 + 0.05)  # past the local bound, possibly not yet past Redis's TTL
    with pytest.raises(LeaseLost, match="not renewed"):
        lease.check()


async def test_keep_renews_and_release_frees_the_lease_at_once(redis):
    lease = Lease(redis, "r", holder="a", ttl_ms=600)
    await lease.acquire()
    stop = asyncio.Event()
    keeper = asyncio.create_task(lease.keep(stop))
    await asyncio.sleep(1.3)  # two TTLs: held only because it was renewed
    assert lease.valid() and await redis.get(lease.key) == b"1 a"
    stop.set()
    await keeper
    await lease.release()
    assert await Lease(redis, "r", holder="b").acquire() == 2


async def test_acquire_waits_for_a_crashed_holders_lease_to_run_out(redis):
    await Lease(redis, "r", holder="crashed", ttl_ms=300).acquire()  # never renewed, never released
    assert await Lease(redis, "r", holder="next", ttl_ms=300).acquire(wait_s=5.0) == 2


async def test_an_announcement_with_an_older_fencing_token_is_refused(redis):
    keys = StreamKeys("r")
    wv = WeightVersion(version=3, uri="/w/v3", sha256="a" * 64)
    assert await announce(redis, keys, wv, fence=2)
    with pytest.raises(FencedOff):
        await announce(redis, keys, WeightVersion(version=4, uri="/w/v4", sha256="b" * 64), fence=1)
    assert (await latest(redis, keys)).version == 3 and await announced_fence(redis, keys) == 2
    assert not await announce(redis, keys, WeightVersion(version=2, uri="/w/v2", sha256="c" * 64), fence=2)
    assert await announce(redis, keys, WeightVersion(version=2, uri="/w/v2", sha256="c" * 64), fence=2,
                          force=True)
    assert (await latest(redis, keys)).version == 2


async def test_a_checkpoint_is_not_written_once_the_lease_is_lost(redis, tmp_path):
    lease = Lease(redis, "r", holder="a")
    await lease.acquire()
    ck = Checkpointer(tmp_path, keep=2, lease=lease)
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    comp = Component("policy", model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))
    ck.save(TrainState(step=1, version=1), [comp])
    assert ck.load([comp]).fence == 1
    await redis.delete(lease.key)
    await Lease(redis, "r", holder="b").acquire()
    await lease.renew()
    with pytest.raises(LeaseLost):
        ck.save(TrainState(step=2, version=2), [comp])
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step00000001"]


async def test_a_second_learner_refuses_to_start_before_loading_a_model(redis, redis_server, tmp_path):
    from searchr1.learner.process import run_learner

    await Lease(redis, "run2", holder="gpu-node-3:4242/learner-0").acquire()
    settings = LearnerSettings(redis={"url": redis_server.url, "run": "run2"}, lease_ttl_ms=1000,
                               model={"path": str(tmp_path / "no-model-here")},
                               checkpoint={"dir": str(tmp_path / "ck")}, weights={"dir": str(tmp_path / "w")})
    with pytest.raises(LeaseHeld, match="gpu-node-3:4242/learner-0"):
        await run_learner(settings)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "w").exists()


async def test_a_dead_process_of_this_host_is_taken_over_at_once_a_live_one_is_not(redis):
    import os
    import socket
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    host = socket.gethostname()
    await Lease(redis, "r", holder=f"{host}:{gone.stdout.strip()}/learner-0").acquire()
    assert await Lease(redis, "r", holder="next").acquire() == 2  # no TTL to wait out
    await redis.delete("searchr1:r:learner:lease")
    await Lease(redis, "r", holder=f"{host}:{os.getppid()}/learner-0").acquire()
    with pytest.raises(LeaseHeld):
        await Lease(redis, "r", holder="other").acquire()
