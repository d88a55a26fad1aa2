"""Every write that decides what is true is fenced by the learner's lease token, against a real Redis: a
learner that lost its lease (a short TTL and a second learner taking over, or the lease key lost by Redis
while the first still believes in it) cannot ack, cannot seal a checkpoint that is loaded, and cannot
write the recovery-snapshot record; a hung learner stops renewing its lease."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
import torch
from torch import nn

from searchr1.core.schemas import WeightVersion
from searchr1.core.watchdog import Watchdog
from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState
from searchr1.streams import Lease, LeaseLost, StreamKeys
from searchr1.weightsync import latest_snapshot_fenced, record_snapshot

RUN = "fencing"


def _component() -> Component:
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Component("policy", model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


async def _lose(redis, old: Lease, key_lost: bool) -> Lease:
    """`old` loses the run to a second learner: its TTL runs out (a partition), or Redis loses the key
    while `old` still believes in its lease. Returns the new holder's lease."""
    if key_lost:
        await redis.delete(old.key)
    else:
        await asyncio.sleep(old.ttl_ms / 1000 + 0.05)
    new = Lease(redis, RUN, holder="new", ttl_ms=30_000)
    await new.acquire()
    return new


@pytest.mark.parametrize("key_lost", [False, True])
async def test_a_stale_learner_cannot_seal_a_checkpoint_that_is_loaded(redis, tmp_path, key_lost):
    comp = _component()
    old = Lease(redis, RUN, holder="old", ttl_ms=30_000 if key_lost else 300)
    await old.acquire()
    ck_old = Checkpointer(tmp_path, keep=5, lease=old)
    assert ck_old.load([comp]) is None
    ck_old.save(TrainState(step=1, version=1, consumed={"a"}), [comp])
    ck_old.save(TrainState(step=2, version=2, consumed={"a", "b"}), [comp])
    new = await _lose(redis, old, key_lost)
    assert old.valid() is key_lost  # with the key lost, the old learner's own view still says it holds it
    with pytest.raises(LeaseLost):
        await old.verify()  # the check the learner makes in Redis before a checkpoint
    ck_new = Checkpointer(tmp_path, keep=5, lease=new)
    assert ck_new.load([comp]).step == 2  # the new learner resumes from the old one's last checkpoint
    with pytest.raises(LeaseLost):
        ck_old.save(TrainState(step=3, version=3, consumed={"a", "b", "c"}), [comp])
    assert not (tmp_path / "step00000003").exists()
    ck_new.save(TrainState(step=3, version=3, consumed={"a", "b", "d"}), [comp])
    # a seal that raced past every check (the old learner's step 4) is never what a later learner loads
    forged = tmp_path / "step00000004"
    shutil.copytree(tmp_path / "step00000002", forged)
    meta = json.loads((forged / "state.json").read_text())
    (forged / "state.json").write_text(json.dumps({**meta, "step": 4, "version": 4}))
    (forged / "manifest.json").unlink()
    third = Lease(redis, RUN, holder="third")
    await redis.delete(new.key)
    await third.acquire()
    state = Checkpointer(tmp_path, keep=5, lease=third).load([comp])
    assert (state.step, state.fence, state.consumed) == (3, new.token, {"a", "b", "d"})


async def test_a_learner_refuses_a_checkpoint_with_a_newer_token_than_its_own(redis, tmp_path):
    comp = _component()
    old = Lease(redis, RUN, holder="old")
    await old.acquire()
    await redis.delete(old.key)
    new = Lease(redis, RUN, holder="new")
    await new.acquire()
    Checkpointer(tmp_path, keep=2, lease=new).save(TrainState(step=1, version=1), [comp])
    with pytest.raises(LeaseLost):
        Checkpointer(tmp_path, keep=2, lease=old).load([comp])


@pytest.mark.parametrize("key_lost", [False, True])
async def test_a_stale_learner_cannot_write_the_recovery_snapshot_record(redis, key_lost):
    keys = StreamKeys(RUN)
    old = Lease(redis, RUN, holder="old", ttl_ms=30_000 if key_lost else 300)
    await old.acquire()
    await record_snapshot(redis, keys, WeightVersion(version=10, uri="/w/v10", sha256="a" * 64), lease=old)
    new = await _lose(redis, old, key_lost)
    with pytest.raises(LeaseLost):  # refused before the new learner has recorded anything
        await record_snapshot(redis, keys, WeightVersion(version=20, uri="/w/v20", sha256="b" * 64), lease=old)
    await record_snapshot(redis, keys, WeightVersion(version=12, uri="/w/v12", sha256="c" * 64), lease=new)
    with pytest.raises(LeaseLost):
        await record_snapshot(redis, keys, WeightVersion(version=30, uri="/w/v30", sha256="d" * 64), lease=old)
    snap, fence = await latest_snapshot_fenced(redis, keys)
    assert (snap.version, fence) == (12, new.token)


async def test_an_unfenced_writer_with_an_older_token_cannot_overwrite_the_snapshot_record(redis):
    keys = StreamKeys(RUN)
    await record_snapshot(redis, keys, WeightVersion(version=5, uri="/w/v5", sha256="a" * 64), fence=2)
    with pytest.raises(RuntimeError):
        await record_snapshot(redis, keys, WeightVersion(version=6, uri="/w/v6", sha256="b" * 64), fence=1)
    snap, fence = await latest_snapshot_fenced(redis, keys)
    assert (snap.version, fence) == (5, 2)


async def test_a_hung_learner_stops_renewing_its_lease(redis):
    lease = Lease(redis, RUN, holder="hung", ttl_ms=600)
    await lease.acquire()
    watchdog = Watchdog("learner", stall_s=0.3)  # never beaten: the loop is stuck
    stop = asyncio.Event()
    keeper = asyncio.create_task(lease.keep(stop, alive=watchdog.alive))
    await asyncio.wait_for(keeper, timeout=10)  # gives up by itself
    assert lease.lost is not None and "no progress" in lease.lost
    assert await Lease(redis, RUN, holder="next", ttl_ms=600).acquire(wait_s=5.0) == 2


async def test_a_learner_built_with_its_lease_fences_its_acks_and_checks_redis_before_a_checkpoint(redis, tmp_path):
    """The learner's composition gives its lease to the trajectories stream and the checkpointer: with the
    lease key lost and a second learner holding the run, the first one's ack and pre-checkpoint check are
    refused although its own view of the lease is still valid."""
    from types import SimpleNamespace

    from searchr1.learner.compose import build_learner
    from searchr1.learner.parts import RedisSide
    from searchr1.learner.settings import LearnerSettings
    from searchr1.streams import trajectories_stream
    from tests.support.synthetic import synthetic_group

    settings = LearnerSettings(redis={"run": RUN}, batch={"groups_per_step": 1}, read_block_ms=50,
                               checkpoint={"dir": str(tmp_path / "ck")}, weights={"dir": str(tmp_path / "w")})
    old = Lease(redis, RUN, holder="old")
    await old.acquire()
    training = SimpleNamespace(trainer=SimpleNamespace(), vocab_size=lambda: 1000)
    learner = build_learner(settings, training, redis=RedisSide(redis, lease=old))
    await learner.source.start()
    await trajectories_stream(redis, StreamKeys(RUN)).publish(synthetic_group("g", group_size=2, rewards=[1.0, 0.0]))
    step = await learner.source.next_step(asyncio.Event(), learner.state)
    learner.source.commit(step.entry_ids)
    await _lose(redis, old, key_lost=True)
    assert old.valid()
    with pytest.raises(LeaseLost):
        await learner.ack()
    assert await learner.source.trajectories.pending() == 1
    with pytest.raises(LeaseLost):
        await learner.hold_lease(in_redis=True)
