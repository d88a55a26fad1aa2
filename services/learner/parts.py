"""The learner loop's collaborators in the groups `compose.build_learner` wires them in, and the null
objects that stand in for the optional ones, so the loop (`service.Learner`) never asks whether one is
there.

Groups: `RedisSide` (rank 0's Redis client, the link every call goes through, the run's lease),
`Outputs` (the step log, the trajectory archive, the dispatcher's durable dispatch record), `Weights`
(the one `WeightPublisher` of the run, the transport that delivers and announces each version, the HTTP
server of the snapshots), `Feed` (the group source and the dispatcher), `Checks` (the collapse guard, the
desync screen, the progress watchdog).

Null objects, each doing what the loop did when the collaborator was missing: `NO_LEASE` (nothing to
hold: every write goes ahead, fencing token 0), `NO_LINK` (a Redis call runs once, directly; nothing to
watch), `NO_ARCHIVE`, `NO_STEP_LOG` (nothing written), `NoDispatcher` (no tasks fed: keeps the
checkpoint's dispatcher position as it found it), `NoSource` (ranks other than 0, which follow rank 0's
broadcasts: nothing to read or ack), `NO_GUARD` (every step continues), `NO_SCREEN` (every group trains),
`NO_WATCHDOG` (never stalls), `NO_SERVER` (snapshots not served over HTTP).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from searchr1.learner.guard import Decision
from searchr1.learner.sources.base import GroupSource, StepGroups

if TYPE_CHECKING:
    from searchr1.core.schemas import TrajectoryGroup
    from searchr1.learner.train.checkpoint import TrainState
    from searchr1.weightsync import WeightPublisher, WeightTransport

R = TypeVar("R")


# ---------------------------------------------------------------------------- what the loop calls


class LeaseLike(Protocol):
    """What the loop asks of the run's lease (`searchr1.streams.Lease`)."""

    token: int

    def valid(self) -> bool: ...

    def check(self) -> None: ...

    async def renew(self) -> Any: ...

    async def verify(self) -> None: ...


class LinkLike(Protocol):
    """What the loop asks of the Redis link (`searchr1.streams.RedisLink`)."""

    up: bool

    async def call(self, fn: Callable[[], Awaitable[R]], what: str = "") -> R: ...

    async def watch(self, redis: Any, stop: asyncio.Event) -> None: ...


class WatchdogLike(Protocol):
    """What the loop asks of the progress watchdog (`searchr1.core.watchdog.Watchdog`)."""

    def beat(self) -> None: ...

    def waiting(self) -> Any: ...

    def progressing(self, measure: Callable[[], int]) -> Any: ...

    def alive(self) -> bool: ...


class DispatcherLike(Protocol):
    """What the loop asks of the dispatcher (`dispatcher.Dispatcher`)."""

    def restore(self, position: dict[str, int], version: int) -> None: ...

    def position(self) -> dict[str, int]: ...

    async def run(self, stop: asyncio.Event, downstream: Any = None) -> None: ...


# ---------------------------------------------------------------------------- null objects


class NoLease:
    """No lease (a learner without Redis, ranks other than 0): nothing to hold, fencing token 0."""

    token = 0

    def valid(self) -> bool:
        return True

    def check(self) -> None:
        return None

    async def renew(self) -> None:
        return None

    async def verify(self) -> None:
        return None


class NoLink:
    """No Redis link: a call runs once, directly; nothing to watch; always up."""

    up = True

    async def call(self, fn: Callable[[], Awaitable[R]], what: str = "") -> R:
        return await fn()

    async def watch(self, redis: Any, stop: asyncio.Event) -> None:
        return None


class NoArchive:
    """No trajectory archive (`archive.enabled` off, a replay, ranks other than 0)."""

    def append(self, step: int, groups: Sequence[TrajectoryGroup], entry_ids: Sequence[str]) -> None:
        return None


class NoStepLog:
    """No step log (ranks other than 0)."""

    def write(self, step: int, figures: dict[str, Any]) -> None:
        return None


class NoGuard:
    """No collapse guard: every step continues."""

    def judge(self, step: int, figures: dict[str, Any]) -> Decision:
        return Decision("continue")


class NoScreen:
    """No desync screen: every group trains."""

    async def screen(self, step: StepGroups) -> StepGroups:
        return step


class NoWatchdog:
    """No progress watchdog: never stalls, excuses nothing."""

    def beat(self) -> None:
        return None

    @contextmanager
    def waiting(self) -> Iterator[None]:
        yield

    @contextmanager
    def progressing(self, measure: Callable[[], int]) -> Iterator[None]:
        yield

    def alive(self) -> bool:
        return True


class NoServer:
    """Snapshots not served over HTTP (`weights.http` off, ranks other than 0)."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class NoDispatcher:
    """No dispatcher (no dataset, ranks other than 0, a replay): no task is fed; the checkpoint keeps the
    dispatcher position it was resumed with (one per learner: it holds that position)."""

    def __init__(self) -> None:
        self._position: dict[str, int] = {}

    def restore(self, position: dict[str, int], version: int) -> None:
        self._position = dict(position)

    def position(self) -> dict[str, int]:
        return dict(self._position)

    async def run(self, stop: asyncio.Event, downstream: Any = None) -> None:
        return None


class NoSource:
    """No group source: ranks other than 0 follow rank 0's broadcasts, so nothing is read, committed,
    acked or granted; reading from it is a bug."""

    async def start(self) -> None:
        return None

    async def next_step(self, stop: asyncio.Event, state: TrainState) -> StepGroups | None:
        raise RuntimeError("rank 0 trains from a group source")

    def commit(self, entry_ids: Sequence[str]) -> None:
        return None

    async def ack(self, checkpointed: bool = True) -> None:
        return None

    async def reject(self, entry_id: str, reason: str) -> None:
        return None

    def grant(self, trained: int, version: int) -> None:
        return None

    async def finished(self) -> bool:
        raise RuntimeError("rank 0 trains from a group source")

    async def lag(self) -> int:
        return 0


NO_LEASE = NoLease()
NO_LINK = NoLink()
NO_ARCHIVE = NoArchive()
NO_STEP_LOG = NoStepLog()
NO_GUARD = NoGuard()
NO_SCREEN = NoScreen()
NO_WATCHDOG = NoWatchdog()
NO_SERVER = NoServer()


# ---------------------------------------------------------------------------- groups


@dataclass(frozen=True)
class RedisSide:
    """Rank 0's Redis in a live run: the client, the run's lease and the link every call goes through.
    Given to `build_learner` with `lease` None (none is held) or `link` None (it makes one, counted on the
    learner's metrics); the loop gets it with both filled in (`NO_LEASE`; without Redis, `NO_REDIS`)."""

    client: Any
    lease: LeaseLike | None = None
    link: LinkLike | None = None


@dataclass(frozen=True)
class Outputs:
    """What rank 0 writes beside checkpoints and snapshots."""

    step_log: Any = NO_STEP_LOG
    """One JSON line per step (`metrics.StepLog`)."""
    archive: Any = NO_ARCHIVE
    """Every trained group, before its entries are acked (`tools.archive.ArchiveWriter`)."""
    record: Callable[[list[str]], None] | None = None
    """The dispatcher's durable record of the task ids it publishes (`tools.dispatch_log.DispatchLog`;
    None: not written down)."""


NO_REDIS = RedisSide(None, NO_LEASE, NO_LINK)
"""A learner without Redis (`train --replay`, ranks other than 0, tests)."""


@dataclass(frozen=True)
class Weights:
    """How each version leaves the learner: the run's one publisher (the snapshot store: what the server
    serves, what a rollback reloads), the transport that delivers and announces each version, and the
    HTTP server of the snapshots."""

    publisher: WeightPublisher
    transport: WeightTransport
    server: Any = NO_SERVER

    async def open(self) -> None:
        """Start serving the snapshots (before the first version is published)."""
        await self.server.start()

    async def close(self) -> None:
        """Close the transport and stop the server."""
        self.transport.close()
        await self.server.stop()


@dataclass(frozen=True)
class Feed:
    """Where the groups come from (the source; `NoSource` on ranks other than 0) and what feeds the tasks
    stream (the dispatcher, run as a task beside the loop on rank 0)."""

    source: GroupSource
    dispatcher: DispatcherLike


@dataclass(frozen=True)
class Checks:
    """What watches the loop: the collapse guard (after each step), the desync screen (before each step
    trains) and the progress watchdog (beaten by progress: the start, a trained step, checkpoint bytes)."""

    guard: Any = NO_GUARD
    screen: Any = NO_SCREEN
    watchdog: WatchdogLike = NO_WATCHDOG
