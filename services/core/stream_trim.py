"""Bounded Redis memory: delete the stream entries every consumer group is done with.

An entry may go once every group that reads its stream has acked it. Within one group, the entries
at or below the group's last-delivered id that are not in its pending list are acked; those above it
have not been read yet. So the oldest entry some group still needs is the smaller of its oldest pending
id and the id just after its last-delivered one, and `XTRIM key MINID <that>` (exact, not `~`) removes
only entries every group has acked. The bound only ever moves forward (ids only grow, a group's
last-delivered id only advances, a claimed entry keeps its id), so a trim computed from a slightly old
view of the groups is still safe. A stream without any group is never trimmed: nobody has said what
it has read.

`safe_min_id` is the pure rule; `trim_acked` reads the groups (XINFO GROUPS, XPENDING per group) and
trims. The streams layer (`searchr1.core.streams`) calls it every `trim_every` acks or publishes.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis import asyncio as aioredis
from redis.exceptions import ResponseError

Call = Callable[[Callable[[], Awaitable[Any]], str], Awaitable[Any]]


def parse_id(entry_id: str) -> tuple[int, int]:
    """`"<ms>-<seq>"` → (ms, seq)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def format_id(key: tuple[int, int]) -> str:
    return f"{key[0]}-{key[1]}"


@dataclass(frozen=True, slots=True)
class GroupView:
    """What one consumer group still needs: its last-delivered id and its oldest pending id (None: no
    entry pending)."""

    name: str
    last_delivered: str
    oldest_pending: str | None


def safe_min_id(groups: Sequence[GroupView]) -> str | None:
    """The smallest id some group still needs (entries below it are acked by every group), or None
    when there is no group (then nothing may be trimmed)."""
    if not groups:
        return None
    need: list[tuple[int, int]] = []
    for g in groups:
        ms, seq = parse_id(g.last_delivered)
        need.append((ms, seq + 1))  # the next entry the group has not read yet
        if g.oldest_pending is not None:
            need.append(parse_id(g.oldest_pending))
    return format_id(min(need))


def _sid(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


async def _direct(fn: Callable[[], Awaitable[Any]], what: str = "") -> Any:
    return await fn()


async def group_views(redis: aioredis.Redis, key: str, call: Call = _direct) -> list[GroupView]:
    """Every consumer group of `key` with its last-delivered and oldest pending id ([] if no stream)."""
    try:
        infos = await call(lambda: redis.xinfo_groups(key), "xinfo groups")
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return []
        raise
    views = []
    for info in infos:
        name = _sid(info["name"])
        oldest = None
        if int(info.get("pending", 0)):
            summary = await call(functools.partial(redis.xpending, key, name), "xpending")
            if summary.get("min") is not None:
                oldest = _sid(summary["min"])
        views.append(GroupView(name, _sid(info["last-delivered-id"]), oldest))
    return views


async def trim_acked(redis: aioredis.Redis, key: str, call: Call = _direct) -> int:
    """Delete the entries of `key` that every consumer group has acked; returns how many went."""
    bound = safe_min_id(await group_views(redis, key, call))
    if bound is None:
        return 0
    return int(await call(lambda: redis.xtrim(key, minid=bound, approximate=False), "xtrim"))
