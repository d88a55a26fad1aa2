"""The learner's lease through a network partition, against a real Redis behind a loopback proxy that stops
forwarding without closing (`tests/support/blackhole.py`): a renewal lost in the partition is abandoned and
tried again on a new connection, so a partition shorter than half the TTL keeps the lease — with the
client's 30 s reply timeout alone, the renewal would wait past the lease's end and the learner would stop."""

from __future__ import annotations

import asyncio
import time

from searchr1.streams import Lease, connect
from tests.support.blackhole import BlackholeProxy


async def _renewed(lease: Lease, after: float) -> None:
    async with asyncio.timeout(30):
        while lease._valid_until <= after:
            await asyncio.sleep(0.02)


async def test_a_partition_shorter_than_half_the_ttl_keeps_the_lease(redis, redis_server):
    proxy = await BlackholeProxy("127.0.0.1", redis_server.port).start()
    client = connect(proxy.url())  # the default 30 s reply timeout
    lease = Lease(client, "partition", ttl_ms=6000)
    stop = asyncio.Event()
    keeper = None
    try:
        await lease.acquire()
        keeper = asyncio.create_task(lease.keep(stop))
        await _renewed(lease, lease._valid_until)  # the first renewal (2 s in)
        renewed_until = lease._valid_until
        proxy.blackhole()  # the next renewal (2 s later) gets no reply
        await asyncio.sleep(2.5)
        proxy.restore()
        await _renewed(lease, renewed_until)  # renewed through a new connection once packets flow
        await asyncio.sleep(max(0.0, renewed_until - time.monotonic()) + 0.5)
        assert lease.lost is None
        lease.check()  # still valid past where the renewal before the partition left it
        assert (await redis.get(lease.key)).decode() == lease.value
    finally:
        stop.set()
        if keeper is not None:
            await keeper
        await client.aclose()
        await proxy.close()
