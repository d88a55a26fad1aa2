"""Redis losing the learners' fence counter cannot take the fencing token back, against a real Redis: a
learner writes checkpoints under token 3, Redis loses its data (flushed, as a new instance would be) or
goes back to an older copy (the counter at 1); a learner started from the same checkpoint directory takes
a token above the highest one on disk, loads the checkpoint and saves the next one. Without that floor the
counter hands out a token at or below 3: the start is refused (the checkpoint's token is newer than its
own) until enough restarts have counted the counter up again, and a used token is handed out twice."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from searchr1.learner.train.checkpoint import Checkpointer, Component, TrainState
from searchr1.learner.train.fences import highest_token
from searchr1.streams import Lease, LeaseLost

RUN = "counter-loss"


def _component() -> Component:
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Component("policy", model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


@pytest.mark.parametrize("loss", ["flushed", "older copy"])
async def test_a_learner_after_redis_lost_its_counter_takes_a_token_above_the_disks(redis, tmp_path, caplog, loss):
    comp = _component()
    for _ in range(2):  # two earlier learners of the run
        earlier = Lease(redis, RUN, holder="earlier")
        await earlier.acquire()
        await earlier.release()
    writer = Lease(redis, RUN, holder="writer")
    assert await writer.acquire() == 3
    ck = Checkpointer(tmp_path, keep=3, lease=writer)
    assert ck.load([comp]) is None  # records its takeover from step 0
    ck.save(TrainState(step=1, version=1, consumed={"a"}), [comp])
    await writer.release()

    if loss == "flushed":
        await redis.flushdb()
    else:
        await redis.set(writer.fence_key, 1)

    # the baseline: the counter alone hands out a token the run already used, and the start is refused
    naive = Lease(redis, RUN, holder="naive")
    reused = await naive.acquire()
    assert reused <= 3
    with pytest.raises(LeaseLost):
        Checkpointer(tmp_path, keep=3, lease=naive).load([comp])
    await redis.delete(naive.key)
    if loss == "flushed":
        await redis.flushdb()
    else:
        await redis.set(writer.fence_key, 1)

    floor = highest_token(tmp_path)
    assert floor == 3
    restarted = Lease(redis, RUN, holder="restarted")
    with caplog.at_level(logging.WARNING, logger="searchr1.streams.lease"):
        assert await restarted.acquire(floor=floor) == 4
    assert "not past token 3 already used (recorded on disk)" in caplog.text
    ck = Checkpointer(tmp_path, keep=3, lease=restarted)
    state = ck.load([comp])
    assert (state.step, state.fence, state.consumed) == (1, 3, {"a"})
    ck.save(TrainState(step=2, version=2, consumed={"a", "b"}), [comp])
    await restarted.verify()  # Redis's counter now agrees: the next learner gets 5
    await restarted.release()
    following = Lease(redis, RUN, holder="following")
    assert await following.acquire(floor=highest_token(tmp_path)) == 5
