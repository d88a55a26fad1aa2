"""Bounded Redis memory: delete the stream entries every consumer group is done with.

An entry may go once every group that reads its stream has acked it. Within one group, the entries
at or below the group's last-delivered id that are not in its pending list are acked; those above it
have not been read yet. So the oldest entry some group still needs is the smaller of its oldest pending
id and the id just after its last-delivered one, and `XTRIM key MINID <that>` (exact, not `~`) removes
only entries every group has acked. The bound only ever moves forward (ids only grow, a group's
last-delivered id only advances, a claimed entry keeps its id), so a trim computed from a slightly old
view of the groups is still safe. A stream without any group is never trimmed: nobody has said what
it has read.

`safe_min_id` is the pure rule and `group_views` reads what it needs (XINFO GROUPS, XPENDING per group).
`trim_acked` applies the same rule inside one Lua script (`_TRIM`: the groups read, the bound computed and
XTRIM run atomically), so a consumer group created while a trim is under way is either seen by it or
created after it: never one whose entries a trim computed without it deletes. A stream
(`searchr1.streams.delivery.StreamBase`) calls it every `trim_every` acks or publishes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from redis import asyncio as aioredis
from redis.exceptions import ResponseError

from searchr1.streams.keys import format_id, parse_id, text
from searchr1.streams.link import Call, direct


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


async def group_views(redis: aioredis.Redis, key: str, call: Call = direct) -> list[GroupView]:
    """Every consumer group of `key` with its last-delivered and oldest pending id ([] if no stream)."""
    try:
        infos = await call(lambda: redis.xinfo_groups(key), "xinfo groups")
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return []
        raise
    views = []
    for info in infos:
        name = text(info["name"])
        oldest = None
        if int(info.get("pending", 0)):
            summary = await call(functools.partial(redis.xpending, key, name), "xpending")
            if summary.get("min") is not None:
                oldest = text(summary["min"])
        views.append(GroupView(name, text(info["last-delivered-id"]), oldest))
    return views


_TRIM = """
local groups = redis.pcall('XINFO', 'GROUPS', KEYS[1])
if groups.err or #groups == 0 then return 0 end
local best_ms, best_seq
local function need(ms, seq)
  if best_ms == nil or ms < best_ms or (ms == best_ms and seq < best_seq) then best_ms, best_seq = ms, seq end
end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
for _, g in ipairs(groups) do
  local name, last
  for j = 1, #g, 2 do
    if g[j] == 'name' then name = g[j + 1] elseif g[j] == 'last-delivered-id' then last = g[j + 1] end
  end
  local ms, seq = parse(last)
  need(ms, seq + 1)
  local summary = redis.call('XPENDING', KEYS[1], name)
  if summary[2] then need(parse(summary[2])) end
end
return redis.call('XTRIM', KEYS[1], 'MINID', string.format('%.0f-%.0f', best_ms, best_seq))
"""
"""`safe_min_id` over the groups of KEYS[1] and the XTRIM MINID it allows, in one atomic step."""


async def trim_acked(redis: aioredis.Redis, key: str, call: Call = direct) -> int:
    """Delete the entries of `key` that every consumer group has acked (the rule of `safe_min_id`, applied
    atomically with reading the groups); returns how many went."""
    return int(await call(lambda: redis.eval(_TRIM, 1, key), "trim"))
