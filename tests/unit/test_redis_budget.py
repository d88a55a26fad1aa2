"""The learner's start-up check of Redis' budget: what it keeps unacked (groups per step × steps between
checkpoints + groups in flight, × bytes per group) against maxmemory, with hand-checked numbers, and every
shipped Search-R1 config against the Redis limits it is deployed with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from searchr1.core.settings import load_settings
from searchr1.learner.redis_budget import RedisBudgetError, check_redis_budget, group_bytes, redis_need_bytes
from searchr1.learner.settings import LearnerSettings

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def test_group_bytes_by_hand():
    # 2048 + 5 × (1024 + 4608 × 24) = 2048 + 5 × 111,616
    assert group_bytes(5, 4608) == 560_128
    assert group_bytes(1, 0) == 2048 + 1024


def test_the_old_3b_cadence_is_refused_with_the_settings_named():
    with pytest.raises(RedisBudgetError) as err:
        check_redis_budget(groups_per_step=512, steps_between_acks=100, max_inflight=512,
                           bytes_per_group=560_128, maxmemory=4 * GIB)
    msg = str(err.value)
    # (512 × 100 + 512) × 560,128 = 28,965,339,136 B = 26.98 GiB
    for part in ("learner.batch.groups_per_step 512", "learner.checkpoint.every 100",
                 "learner.dispatcher.max_inflight 512", "learner.batch.max_seq_len", "26.98 GiB",
                 "maxmemory 4.00 GiB", "REDIS_MAXMEMORY"):
        assert part in msg, (part, msg)
    # 4 GiB // 560,128 = 7,667 groups; (7,667 − 512) // 512 = 13 steps
    assert "learner.checkpoint.every ≤ 13" in msg


def test_the_largest_cadence_it_suggests_fits_and_one_more_does_not():
    ok = check_redis_budget(groups_per_step=512, steps_between_acks=13, max_inflight=512,
                            bytes_per_group=560_128, maxmemory=4 * GIB)
    assert ok.held_groups == 7168 and ok.need_bytes == 4_014_997_504 and ok.fits
    with pytest.raises(RedisBudgetError):
        check_redis_budget(groups_per_step=512, steps_between_acks=14, max_inflight=512,
                           bytes_per_group=560_128, maxmemory=4 * GIB)


def test_no_maxmemory_means_no_limit():
    b = check_redis_budget(groups_per_step=512, steps_between_acks=100, max_inflight=512,
                           bytes_per_group=560_128, maxmemory=0)
    assert b.fits and b.need_bytes == 28_965_339_136


def _k8s_redis_maxmemory() -> int:
    docs = yaml.safe_load_all((ROOT / "deploy/k8s/base/redis.yaml").read_text())
    for d in docs:
        if d and d.get("kind") == "Deployment":
            env = d["spec"]["template"]["spec"]["containers"][0]["env"]
            value = next(e["value"] for e in env if e["name"] == "REDIS_MAXMEMORY")
            m = re.fullmatch(r"(\d+)mb", value)
            assert m, value
            return int(m.group(1)) * 2**20
    raise AssertionError("no Redis Deployment")


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("searchr1-*.toml")))
def test_shipped_searchr1_configs_fit_compose_and_the_k8s_redis(config):
    s = load_settings(LearnerSettings, ROOT / "configs" / config)
    need = redis_need_bytes(s)
    assert need <= 4 * GIB  # docker-compose.yml's REDIS_MAXMEMORY default
    assert need <= _k8s_redis_maxmemory(), (config, need / 2**20)


def test_the_tiny_world_fits_the_k8s_cpu_overlays_redis():
    text = (ROOT / "deploy/k8s/overlays/cpu/kustomization.yaml").read_text()
    cap = int(re.search(r"name: REDIS_MAXMEMORY, value: (\d+)mb", text).group(1)) * 2**20
    assert redis_need_bytes(load_settings(LearnerSettings, ROOT / "deploy/k8s/base/compose.toml")) <= cap
    assert redis_need_bytes(load_settings(LearnerSettings, ROOT / "configs/compose.toml")) <= 4 * GIB
