"""Health gates: the checks a started process must pass before the next one in dependency order starts.

Each gate makes one short attempt and answers `(ok, detail)`; the supervisor polls the gates of a
process until all pass, the process dies, or its health timeout runs out (then `detail` says what the
last attempt saw). Gates know nothing about which service they probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from searchr1.core.redaction import redact_url

ATTEMPT_TIMEOUT_S = 2.0


class Gate(Protocol):
    """One health probe."""

    description: str

    async def check(self) -> tuple[bool, str]:
        """One attempt: (passed, what was seen)."""
        ...


@dataclass(frozen=True)
class HttpGate:
    """`GET url` answers 200."""

    url: str

    @property
    def description(self) -> str:
        return f"GET {self.url} → 200"

    async def check(self) -> tuple[bool, str]:
        import httpx

        try:
            async with httpx.AsyncClient(timeout=ATTEMPT_TIMEOUT_S, trust_env=False) as client:
                resp = await client.get(self.url)
        except httpx.HTTPError as exc:
            return False, f"GET {self.url}: {type(exc).__name__}"
        return resp.status_code == 200, f"GET {self.url}: HTTP {resp.status_code}"


@dataclass(frozen=True)
class GrpcHealthGate:
    """The standard gRPC health service (`grpc.health.v1`) reports SERVING for `service`."""

    target: str
    service: str = ""

    @property
    def description(self) -> str:
        return f"gRPC health Check({self.service!r}) at {self.target} → SERVING"

    async def check(self) -> tuple[bool, str]:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            async with grpc.aio.insecure_channel(self.target) as channel:
                resp = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=self.service), timeout=ATTEMPT_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return False, f"gRPC health at {self.target}: {exc.code().name}"
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        return resp.status == health_pb2.HealthCheckResponse.SERVING, f"gRPC health at {self.target}: {status}"


@dataclass(frozen=True)
class RedisPingGate:
    """Redis answers PING."""

    url: str

    @property
    def description(self) -> str:
        return f"PING {redact_url(self.url)}"

    async def check(self) -> tuple[bool, str]:
        from redis import asyncio as aioredis
        from redis.exceptions import RedisError

        client = aioredis.Redis.from_url(self.url, socket_timeout=ATTEMPT_TIMEOUT_S,
                                         socket_connect_timeout=ATTEMPT_TIMEOUT_S)
        try:
            return bool(await client.ping()), f"{self.description}: PONG"
        except (RedisError, OSError) as exc:
            return False, f"{self.description}: {type(exc).__name__}"
        finally:
            await client.aclose()


async def check_all(gates: tuple[Gate, ...] | list[Gate]) -> tuple[bool, str]:
    """Run the gates in order, stopping at the first that fails."""
    for gate in gates:
        ok, detail = await gate.check()
        if not ok:
            return False, detail
    return True, "healthy"
