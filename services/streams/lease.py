"""A single-holder lease in Redis with a fencing token: one learner per run.

`Lease.acquire` sets `searchr1:{run}:{name}:lease` with SET NX PX and, in the same Lua script, takes
the next fencing token from `searchr1:{run}:{name}:fence` (INCR: strictly increasing over the run's
life, never reused). Redis can lose the counter (data lost since its last fsync, a restore from an older
copy, a new instance), so `acquire` takes a `floor` — the highest token the holder's own durable records
hold (the learner's checkpoints: `learner/train/fences.py`) — and a counter at or below it is raised
past it in the same script, with a warning: a token that wrote anything is never handed out again. The lease value is `"{token} {holder}"`. A second process finds the key set and
`acquire` raises `LeaseHeld` naming the holder and how long its lease still runs, unless the holder
(`host:pid/…`) is a process of this host that no longer runs, or this very process id (a container
restarted under the same hostname): its lease is taken over at once instead of after its TTL.

The holder renews the lease (`renew`: PEXPIRE only while the value is still its own) every
`ttl / 3`. `valid()` is the holder's local view: the lease is valid while the last successful renewal
is younger than the TTL less a safety margin, measured on the monotonic clock from *before* the renewal
was sent, so the holder stops believing in its lease before Redis can give it to another process. A
holder that finds its value replaced, or cannot renew in time, has lost the lease: `check()` raises
`LeaseLost` and the holder must stop before writing anything (checkpoints, snapshots, announcements).

Everything the holder writes carries its token; readers that see a higher token than the one in front
of them know the writer was fenced off. The writes that decide what is true are also checked inside
Redis, in the same Lua script as the write (`FENCE_CHECK`, with `fence_keys()` and `fence_args()`): a
write is refused when the run's fence counter has moved past the writer's token (another learner
acquired the lease since, even if the lease key itself was lost) or the lease key holds another value.
`verify()` runs that check alone, right before a write Redis does not hold (a checkpoint on disk).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable

from redis import asyncio as aioredis

log = logging.getLogger("searchr1.streams.lease")

_ACQUIRE = """
if redis.call('SET', KEYS[1], 'claiming', 'NX', 'PX', ARGV[2]) then
  local token = redis.call('INCR', KEYS[2])
  local given = token
  if token <= tonumber(ARGV[3]) then
    token = tonumber(ARGV[3]) + 1
    redis.call('SET', KEYS[2], token)
  end
  redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
  return {token, '', given}
end
return {0, redis.call('GET', KEYS[1]) or '', 0}
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


FENCE_CHECK = """
local function fenced_off(lease_key, fence_key, token, value)
  local newest = tonumber(redis.call('GET', fence_key) or '0')
  if newest > tonumber(token) then return true end
  local current = redis.call('GET', lease_key)
  return current ~= false and current ~= value
end
"""
"""A Lua function `fenced_off(lease_key, fence_key, token, value)` for scripts that write on a lease
holder's behalf: true when a newer token was handed out (the fence counter is past `token`) or the lease
is someone else's. A lease key that is gone (expired, or lost by Redis) with no newer token does not
fence: nobody else can have written."""

_VERIFY = FENCE_CHECK + """
if fenced_off(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return 0 end
return 1
"""


class LeaseHeld(RuntimeError):
    """Another process holds the lease."""


class LeaseLost(RuntimeError):
    """This process held the lease and no longer does: it must stop before it writes."""


def default_holder() -> str:
    """`host:pid`: enough to find the other process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _dead_here(holder: str) -> bool:
    """True when `holder` (`host:pid[/…]`) names this host and a process that is gone, or this very
    process (a container restarted with the same hostname and pid: its previous run held it)."""
    host, _, rest = holder.partition(":")
    pid_text = rest.split("/", 1)[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Lease:
    """One holder's lease `name` of run `run` (see the module docstring)."""

    def __init__(self, redis: aioredis.Redis, run: str, name: str = "learner", *, ttl_ms: int = 30_000,
                 holder: str | None = None, margin: float = 0.2) -> None:
        if ttl_ms < 100:
            raise ValueError(f"ttl_ms must be at least 100, got {ttl_ms}")
        self.redis = redis
        self.key = f"searchr1:{run}:{name}:lease"
        self.fence_key = f"searchr1:{run}:{name}:fence"
        self.ttl_ms = ttl_ms
        self.holder = (holder or default_holder()).replace(" ", "_")
        self.margin = margin
        self.token = 0
        """The fencing token (0 until acquired)."""
        self.lost: str | None = None
        """Why the lease was lost (None while held or before `acquire`)."""
        self._valid_until = 0.0

    @property
    def value(self) -> str:
        return f"{self.token} {self.holder}"

    def fence_keys(self) -> list[str]:
        """The KEYS a fenced script passes to `fenced_off` (lease key, fence counter)."""
        return [self.key, self.fence_key]

    def fence_args(self) -> list[str]:
        """The ARGV a fenced script passes to `fenced_off` (token, lease value)."""
        return [str(self.token), self.value]

    def fenced_error(self, what: str) -> LeaseLost:
        """Mark the lease lost because Redis refused `what`, and return the error to raise."""
        self.mark_lost(f"{what} refused by Redis: fencing token {self.token} is no longer the run's newest")
        return LeaseLost(self.lost or what)

    async def verify(self) -> None:
        """Check in Redis that no newer token was handed out and the lease is not another holder's;
        raise `LeaseLost` otherwise (also when the local view already says so)."""
        self.check()
        ok = await self.redis.eval(_VERIFY, 2, *self.fence_keys(), *self.fence_args())
        if not int(ok):
            raise self.fenced_error(f"lease {self.key!r} check")

    async def acquire(self, wait_s: float = 0.0, floor: int = 0) -> int:
        """Take the lease and a new fencing token, above `floor` (the module docstring); raise `LeaseHeld`
        naming the holder if it is still taken after `wait_s` seconds (a crashed holder's lease runs out
        within one TTL)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return await self._acquire_once(floor)
            except LeaseHeld as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                log.warning("%s; trying again", exc)
                await asyncio.sleep(min(left, self.ttl_ms / 3000))

    async def _acquire_once(self, floor: int) -> int:
        sent = time.monotonic()
        token, current, given = await self.redis.eval(_ACQUIRE, 2, self.key, self.fence_key, self.holder,
                                                      self.ttl_ms, floor)
        current = current.decode() if isinstance(current, bytes) else str(current)
        if not int(token) and _dead_here(current.partition(" ")[2]):
            # this host's previous incarnation (a restarted process or container) died holding it
            log.warning("lease %s is held by %r, which no longer runs on this host: taking it over",
                        self.key, current)
            await self.redis.eval(_RELEASE, 1, self.key, current)
            sent = time.monotonic()
            token, current, given = await self.redis.eval(_ACQUIRE, 2, self.key, self.fence_key, self.holder,
                                                          self.ttl_ms, floor)
            current = current.decode() if isinstance(current, bytes) else str(current)
        if not int(token):
            left = await self.redis.pttl(self.key)
            tok, _, who = current.partition(" ")
            raise LeaseHeld(
                f"another learner holds run's lease {self.key!r}: {who or current} (fencing token {tok}), "
                f"for {max(left, 0) / 1000:.1f} s more unless it renews it; stop that learner first (a "
                "crashed one's lease expires by itself)")
        if int(given) != int(token):
            log.warning("fence counter %s handed out token %d, not past token %d already used (recorded on disk): "
                        "Redis lost it (data lost, or an older copy restored); raised to %d", self.fence_key,
                        int(given), floor, int(token))
        self.token, self.lost = int(token), None
        self._valid_until = sent + self.ttl_ms / 1000 * (1 - self.margin)
        log.info("holding lease %s with fencing token %d", self.key, self.token)
        return self.token

    async def renew(self) -> bool:
        """Extend the lease; False (and `lost` set) when it is no longer ours."""
        if self.lost is not None:
            return False
        sent = time.monotonic()
        ok = await self.redis.eval(_RENEW, 1, self.key, self.value, self.ttl_ms)
        if not int(ok):
            self.mark_lost(f"lease {self.key!r} is no longer held by {self.value!r}")
            return False
        self._valid_until = sent + self.ttl_ms / 1000 * (1 - self.margin)
        return True

    def mark_lost(self, why: str) -> None:
        if self.lost is None:
            log.error("lost the lease: %s", why)
        self.lost = why

    def valid(self) -> bool:
        """The holder's local view: acquired, not lost and renewed recently enough."""
        return self.token > 0 and self.lost is None and time.monotonic() < self._valid_until

    def check(self) -> None:
        """Raise `LeaseLost` unless `valid()`: call it right before every write."""
        if self.valid():
            return
        if self.lost is None and self.token > 0:
            self.mark_lost(f"lease {self.key!r} was not renewed within {self.ttl_ms * (1 - self.margin):.0f} ms")
        raise LeaseLost(self.lost or f"lease {self.key!r} was never acquired")

    async def keep(self, stop: asyncio.Event, alive: Callable[[], bool] = lambda: True) -> None:
        """Renew every `ttl / 3` until `stop` or the lease is lost (a Redis error counts as a failed
        renewal; the lease runs out by itself if Redis stays away). Once `alive()` is False (the holder's
        progress watchdog, `searchr1.core.watchdog`: its loop made no progress for too long) the holder
        stops renewing and marks the lease lost, so a hung holder lets it expire for another process
        instead of holding the run forever. A renewal may take a sixth of the TTL:
        one lost in a partition (a black-holed connection, no reply and no reset) is abandoned, its
        connection dropped, and tried again on a new one a thirtieth of the TTL later, so a learner keeps
        its lease through a partition of 0.4 TTL whenever it begins (0.73 TTL when it begins right after
        a renewal); the client's 30 s reply timeout alone would outlast the lease."""
        period = self.ttl_ms / 3000
        wait, failing = period, 0
        while not stop.is_set() and self.lost is None:
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
                return
            except TimeoutError:
                pass
            if not alive():
                self.mark_lost(f"lease {self.key!r} no longer renewed: the holder made no progress")
                return
            try:
                await asyncio.wait_for(self.renew(), timeout=period / 2)
            except Exception as exc:  # noqa: BLE001  # Redis away: `valid()` runs out on its own
                if not failing:
                    log.warning("could not renew lease %s (trying again every %.1f s): %s", self.key,
                                period / 10, "no reply" if isinstance(exc, TimeoutError) else exc)
                wait, failing = period / 10, failing + 1
            else:
                if failing:
                    log.warning("renewed lease %s after %d failed attempt(s)", self.key, failing)
                wait, failing = period, 0

    async def release(self) -> None:
        """Give the lease up (only if it is still ours), so a successor need not wait for the TTL."""
        if self.token > 0 and self.lost is None:
            await self.redis.eval(_RELEASE, 1, self.key, self.value)
        self.lost = "released"

    async def release_quietly(self, timeout_s: float = 5.0) -> None:
        """`release` on the way out, never raising: with Redis away the lease expires by itself."""
        if self.token == 0:
            return
        try:
            await asyncio.wait_for(self.release(), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not release lease %s (it expires by itself): %s", self.key, exc)
