"""The soak's hosts (tests/faults/netns.py), as root on Linux: a link routed through a host's network
namespace carries bytes both ways; with the host's veth down nothing crosses it and a new connection to
the host fails at once as unreachable (it never leaves the machine by the default route); with the veth
up again the link works. Skipped, with the reason, where namespaces cannot be made."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest

from tests.faults.chaos_proxy import ChaosProxy
from tests.faults.netns import Hosts, netns_unavailable
from tests.faults.soak import Links

pytestmark = pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))


def _echo_server(links: Links) -> int:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def start() -> int:
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        return server.sockets[0].getsockname()[1]
    return asyncio.run_coroutine_threadsafe(start(), links.loop).result(10)


def _roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def _closed(port: int) -> bool:
    """True when the proxy ends a new connection without an answer. Its close arrives as an orderly end
    of stream, or as a reset when the byte sent was still unread in the proxy's socket at the close."""
    try:
        return _roundtrip(port, b"x") == b""
    except ConnectionResetError:
        return True


def test_a_link_through_a_host_and_its_partition():
    links = Links()
    hosts = Hosts("test", loop=links.loop)
    try:
        hosts.create(["h"])
        echo_port = _echo_server(links)
        target, veth = hosts.route("h-echo", echo_port)
        link = links.add("h-echo", ChaosProxy(target))
        assert _roundtrip(link.proxy.port, b"through the namespace" * 1000) == b"through the namespace" * 1000

        hosts.link(veth, up=False)
        with pytest.raises(OSError) as caught:
            socket.create_connection(target, timeout=5)
        assert caught.value.errno == errno.EHOSTUNREACH, caught.value  # not a timeout, not a stranger's answer
        assert _closed(link.proxy.port)  # the proxy cannot reach the host: it closes the client's side

        hosts.link(veth, up=True)
        assert _roundtrip(link.proxy.port, b"again") == b"again"
    finally:
        hosts.destroy()
        links.close()
    assert not any(ns.startswith(f"sr1-{hosts.tag}-") for ns in _namespaces())


def _namespaces() -> list[str]:
    import subprocess

    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
