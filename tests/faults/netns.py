"""Hosts for the soak on one Linux machine: one network namespace per client "host" (each rollout worker,
the learner), joined to the root namespace by a veth pair (root side 10.N.i.1/30, host side 10.N.i.2/30).
A partition of a host is its veth taken down (`ip link set … down`); these kernels have no `tc netem`,
so latency and loss come from the soak's userspace proxy in the path.

`searchr1 up` and its services keep running in the root namespace (its supervisor, health gates and
loopback addresses unchanged), so a link is routed *through* the host's namespace and back: the client
connects to its proxy on loopback, the proxy to a relay inside the host's namespace (10.N.i.2), the relay
back over the veth to a forwarder on the root side (10.N.i.1), the forwarder to the server. Every byte of
that link crosses the veth twice; with the veth down, nothing of it moves and new connections fail (10.N/16
is an unreachable route in the root namespace, so nothing meant for a host whose veth is down leaves the
machine by the default route).

Needs root and `ip` (iproute2); `netns_unavailable()` says why not otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.faults.chaos_proxy import ChaosProxy

ROOT = Path(__file__).resolve().parents[2]


def netns_unavailable() -> str | None:
    """Why the soak cannot spread over network namespaces here (None: it can)."""
    if sys.platform != "linux":
        return f"network namespaces are Linux-only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "not root (ip netns add needs CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "iproute2's ip command is not on PATH"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Hosts:
    """The namespaces, veths, relays and root-side forwarders of one soak."""

    def __init__(self, tag: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        n = os.getpid() % 10000
        self.tag = f"{n:04d}"
        self.octet = 200 + n % 50
        self.hosts: list[str] = []
        self.relays: list[subprocess.Popen] = []
        self.forwarders: list[ChaosProxy] = []
        self.loop = loop
        self._next_port = 20000
        self._route = False

    def namespaces(self) -> list[str]:
        return [self.ns(h) for h in self.hosts]

    def ns(self, host: str) -> str:
        return f"sr1-{self.tag}-{host}"

    def veth(self, host: str) -> str:
        return f"sr{self.tag}{self.hosts.index(host)}a"

    def create(self, hosts: list[str]) -> None:
        # With a veth down its /30 route goes too, and a connection to that host would follow the default
        # route off the machine: the whole 10.N/16 is unreachable but for the /30s of the links that are up.
        _ip("route", "add", "unreachable", f"10.{self.octet}.0.0/16")
        self._route = True
        for i, host in enumerate(hosts):
            self.hosts.append(host)
            ns, root_end, ns_end = self.ns(host), f"sr{self.tag}{i}a", f"sr{self.tag}{i}b"
            _ip("netns", "add", ns)
            _ip("link", "add", root_end, "type", "veth", "peer", "name", ns_end)
            _ip("link", "set", ns_end, "netns", ns)
            _ip("addr", "add", f"10.{self.octet}.{i}.1/30", "dev", root_end)
            _ip("link", "set", root_end, "up")
            _ip("-n", ns, "addr", "add", f"10.{self.octet}.{i}.2/30", "dev", ns_end)
            _ip("-n", ns, "link", "set", ns_end, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def route(self, link: str, target_port: int) -> tuple[tuple[str, int], str]:
        """Route a link of host `link.split('-')[0]` to `127.0.0.1:target_port` through its namespace;
        returns the address its proxy connects to and the veth a partition takes down."""
        host = link.split("-")[0]
        i = self.hosts.index(host)
        root_addr, ns_addr = f"10.{self.octet}.{i}.1", f"10.{self.octet}.{i}.2"
        assert self.loop is not None, "Hosts.loop: the event loop the forwarders run on"
        forwarder = ChaosProxy(("127.0.0.1", target_port), listen_host=root_addr, port=0)
        asyncio.run_coroutine_threadsafe(forwarder.start(), self.loop).result(10)
        self.forwarders.append(forwarder)
        port = self._next_port
        self._next_port += 1
        relay = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(host), sys.executable, "-m", "tests.faults.chaos_proxy",
             "--listen", f"{ns_addr}:{port}", "--target", f"{root_addr}:{forwarder.port}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.relays.append(relay)
        line = relay.stdout.readline() if relay.stdout else ""
        if not line.startswith("relay"):
            raise RuntimeError(f"the relay in {self.ns(host)} did not start: {line}")
        return (ns_addr, port), self.veth(host)

    def link(self, veth: str, *, up: bool) -> None:
        _ip("link", "set", veth, "up" if up else "down")
        if up:  # the address's routes come back with the link; give the kernel a moment
            time.sleep(0.2)

    def destroy(self) -> None:
        for relay in self.relays:
            if relay.poll() is None:
                relay.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    relay.wait(timeout=5)
                if relay.poll() is None:
                    relay.kill()
                    relay.wait()
        if self.loop is not None:
            for f in self.forwarders:
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(f.close(), self.loop).result(10)
        if self._route:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("route", "del", "unreachable", f"10.{self.octet}.0.0/16")
        for i, host in enumerate(self.hosts):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("link", "del", f"sr{self.tag}{i}a")
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", self.ns(host))
