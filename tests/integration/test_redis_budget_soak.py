"""Redis at 3B-shaped groups: the learner's start-up check reads maxmemory from a real Redis and refuses
the 3B run's old checkpoint cadence (every 100 steps) while it accepts the shipped one; `searchr1 train
--check` runs that check alone and exits 0 or 2; and a soak of
3B-sized groups (G = 5, 1,200 response tokens, log-probs, the wire's msgpack) through the real streams,
acked only at each checkpoint, keeps Redis' used_memory under what the check predicts for that shape
(fewer groups per step than the 3B run, so it takes seconds; benchmarks/redis_budget.py runs 512)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from searchr1.core.settings import load_settings
from searchr1.learner.redis_budget import (
    RedisBudgetError,
    check_redis_budget,
    enforce_redis_budget,
    group_bytes,
)
from searchr1.learner.settings import LearnerSettings

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import redis_budget as bench  # noqa: E402


@pytest.fixture
async def capped(redis):
    await redis.config_set("maxmemory", 4 * 2**30)
    try:
        yield redis
    finally:
        await redis.config_set("maxmemory", 0)


async def test_the_check_reads_maxmemory_and_refuses_the_old_cadence(capped):
    shipped = load_settings(LearnerSettings, ROOT / "configs/searchr1-3b-grpo.toml")
    budget = await enforce_redis_budget(shipped, capped)
    assert budget.maxmemory == 4 * 2**30 and budget.fits
    old = shipped.model_copy(update={"checkpoint": shipped.checkpoint.model_copy(update={"every": 100})})
    with pytest.raises(RedisBudgetError, match=r"learner\.checkpoint\.every 100"):
        await enforce_redis_budget(old, capped)


async def test_train_check_runs_the_same_check_and_exits_without_training(capped, redis_server):
    """`searchr1 train --check` (the compose projects' learner-check): 0 and the figures when Redis holds
    the run, 2 and the message naming the settings when it does not; no lease taken, nothing written."""
    import asyncio

    argv = [sys.executable, "-m", "searchr1.cli", "train", "--config", str(ROOT / "configs/searchr1-3b-grpo.toml"),
            "--redis", redis_server.url, "--check"]

    async def check() -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        return proc.returncode, out.decode(), err.decode()

    code, out, err = await check()
    assert code == 0, err
    assert "Redis holds what this run keeps unacked: 2560 groups" in out and "maxmemory 4.00 GiB" in out
    await capped.config_set("maxmemory", 256 * 2**20)
    code, out, err = await check()
    assert code == 2 and err.startswith("error: Redis cannot hold what this run keeps unacked"), (out, err)
    assert "learner.checkpoint.every 4" in err and "Redis maxmemory 0.25 GiB" in err
    assert await capped.dbsize() == 0  # no lease, no stream: the check only reads INFO


async def test_redis_used_memory_stays_under_the_prediction_at_3b_group_shapes(redis_server):
    groups_per_step, every, inflight, response = 32, 3, 32, 1200
    result = await bench.soak(redis_server.url, groups_per_step=groups_per_step, group_size=5,
                              response_tokens=response, every=every, max_inflight=inflight, steps=7)
    assert result["read"] == 7 * groups_per_step
    predicted = check_redis_budget(groups_per_step=groups_per_step, steps_between_acks=every, max_inflight=inflight,
                                   bytes_per_group=group_bytes(5, 250 + response), maxmemory=0).need_bytes
    held = groups_per_step * every + inflight
    # the soak really held that many groups at its peak, each at least 90 % of its wire bytes
    assert result["peak_over_baseline"] > held * min(result["template_bytes"]) * 0.9
    assert result["peak_over_baseline"] <= predicted, (result, predicted)
