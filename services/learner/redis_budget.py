"""What the learner keeps in Redis, against Redis' memory limit: a start-up check.

Trajectory groups stay in the trajectories stream until the learner acks them, and it acks a step's
groups only once a checkpoint covers that step (`learner.checkpoint.every`); the dispatcher lets the
rollout workers run up to `learner.dispatcher.max_inflight` groups ahead of training. So Redis must hold

    (groups_per_step × checkpoint.every + max_inflight) × bytes per group

where a group's bytes follow from its shape (`group_bytes`: G trajectories of at most
`learner.batch.max_seq_len` tokens, each token's id, loss mask, behaviour log-prob and text in msgpack).
Redis runs with `maxmemory` and `noeviction`: past the limit it refuses the workers' writes while the
learner waits for groups it needs before it can checkpoint and ack — a run that stalls for good. The
learner refuses to start instead (`check_redis_budget`), naming the settings to change.

The per-token figures are measured (benchmarks/redis_budget.py: 3B shapes, the wire's msgpack, Redis 7's
`used_memory` per stream entry); the bound assumes every trajectory is `max_seq_len` tokens long, so real
runs (mean response far shorter) sit well under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from searchr1.learner.settings import LearnerSettings

__all__ = ["RedisBudgetError", "RedisBudget", "group_bytes", "redis_need_bytes", "check_redis_budget",
           "redis_maxmemory", "enforce_redis_budget"]

TOKEN_BYTES = 24
"""Bytes one response token costs in Redis: msgpack id (≤ 5), loss mask (1), log-prob (9), its text
(UTF-8, ~4–5) and the stream's own overhead, rounded up (benchmarks/redis_budget.py measures it)."""
TRAJECTORY_BYTES = 1024
"""Per trajectory: reward components, counters, finish reason, segments, map keys."""
GROUP_BYTES = 2048
"""Per group: the task (question, answers, sampling), worker id, timings, the stream entry itself."""


class RedisBudgetError(ValueError):
    """The run keeps more unacked in Redis than its maxmemory allows; the message names the settings."""


@dataclass(frozen=True)
class RedisBudget:
    held_groups: int
    """Groups Redis holds at most: groups_per_step × checkpoint.every + max_inflight."""
    bytes_per_group: int
    need_bytes: int
    maxmemory: int
    """Redis' limit in bytes (0: none)."""

    @property
    def fits(self) -> bool:
        return self.maxmemory == 0 or self.need_bytes <= self.maxmemory


def group_bytes(group_size: int, tokens: int) -> int:
    """Upper bound of one group's bytes in Redis with `group_size` trajectories of `tokens` tokens."""
    return GROUP_BYTES + group_size * (TRAJECTORY_BYTES + tokens * TOKEN_BYTES)


def check_redis_budget(*, groups_per_step: int, steps_between_acks: int, max_inflight: int,
                       bytes_per_group: int, maxmemory: int) -> RedisBudget:
    """The budget; raises RedisBudgetError when `maxmemory` (bytes, 0 = unlimited) cannot hold it."""
    held = groups_per_step * steps_between_acks + max_inflight
    budget = RedisBudget(held, bytes_per_group, held * bytes_per_group, maxmemory)
    if not budget.fits:
        most = max(0, (maxmemory // bytes_per_group - max_inflight) // groups_per_step)
        raise RedisBudgetError(
            f"Redis cannot hold what this run keeps unacked: (learner.batch.groups_per_step {groups_per_step} × "
            f"learner.checkpoint.every {steps_between_acks} + learner.dispatcher.max_inflight {max_inflight}) "
            f"groups × {bytes_per_group / 2**20:.2f} MiB per group (its group_size trajectories of up to "
            f"learner.batch.max_seq_len tokens) = {budget.need_bytes / 2**30:.2f} GiB > Redis maxmemory "
            f"{maxmemory / 2**30:.2f} GiB. Checkpoint more often (learner.checkpoint.every ≤ {most}), or raise "
            f"Redis' maxmemory (REDIS_MAXMEMORY in compose, the redis container's --maxmemory in Kubernetes) "
            f"to at least {budget.need_bytes / 2**30:.2f} GiB.")
    return budget


def redis_need_bytes(s: LearnerSettings) -> int:
    """What Redis must hold for the learner settings `s` (no maxmemory involved)."""
    return check_redis_budget(groups_per_step=s.batch.groups_per_step, steps_between_acks=s.checkpoint.every,
                              max_inflight=s.dispatcher.max_inflight,
                              bytes_per_group=group_bytes(s.dispatcher.group_size, s.batch.max_seq_len),
                              maxmemory=0).need_bytes


async def redis_maxmemory(redis) -> int:
    """Redis' `maxmemory` in bytes from INFO memory (allowed where CONFIG GET is not); 0 = no limit."""
    info = await redis.info("memory")
    return int(info.get("maxmemory", 0))


async def enforce_redis_budget(s: LearnerSettings, redis) -> RedisBudget:
    """`check_redis_budget` for `s` against the Redis the learner talks to."""
    return check_redis_budget(groups_per_step=s.batch.groups_per_step, steps_between_acks=s.checkpoint.every,
                              max_inflight=s.dispatcher.max_inflight,
                              bytes_per_group=group_bytes(s.dispatcher.group_size, s.batch.max_seq_len),
                              maxmemory=await redis_maxmemory(redis))
