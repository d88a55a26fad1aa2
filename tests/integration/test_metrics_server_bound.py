"""The metrics/probe server under half-sent requests, over real HTTP on loopback: connections that send
part of a request and stall hold at most `max_connections` threads (each newer one shuts an older idle
one down), each is closed after `read_timeout_s` without a byte, and the server then answers scrapes and
probes; idle connections held open at the bound and reopened as they are closed do not starve the
probes; connections being answered are never shut down for a newcomer."""

from __future__ import annotations

import socket
import threading
import time

import httpx
from prometheus_client import Counter

from searchr1.core.metrics import new_registry, start_metrics_server


def _stalled(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the request never ends
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(30)  # a liveness bound on the test only
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, TimeoutError):
        return False
    return True


def test_half_sent_requests_hold_a_bounded_number_of_threads():
    registry = new_registry()
    Counter("searchr1_test_total", "a counter", registry=registry).inc()
    base = threading.active_count()
    server = start_metrics_server(registry, ready=lambda: True, max_connections=4, read_timeout_s=1.0)
    held = [_stalled(server.port) for _ in range(40)]
    try:
        peak = 0
        for _ in range(20):  # sample the thread count while the connections are held
            peak = max(peak, threading.active_count() - base)
            time.sleep(0.02)
        assert peak <= 1 + 2 * 4  # the serving thread, max_connections served and as many ending
        assert all(_closed_by_server(s) for s in held)  # refused at once, or timed out after 1 s
        scrape = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
        assert scrape.status_code == 200 and "searchr1_test_total 1.0" in scrape.text
        assert httpx.get(f"http://127.0.0.1:{server.port}/readyz", timeout=10).status_code == 200
    finally:
        for s in held:
            s.close()
        server.close()


def test_a_slow_drip_request_is_closed_at_its_deadline():
    """A client that sends one byte just under the read timeout is shut down once `deadline_s` has passed
    and another connection arrives."""
    registry = new_registry()
    server = start_metrics_server(registry, max_connections=4, read_timeout_s=5.0, deadline_s=0.5)
    drip = _stalled(server.port)
    try:
        time.sleep(0.8)
        drip.sendall(b"X")
        assert httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).status_code == 200
        assert _closed_by_server(drip)
    finally:
        drip.close()
        server.close()


def _answer(port: int, path: str = "/healthz") -> int | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.settimeout(2)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = s.recv(64)
    except OSError:
        return None
    return int(head.split()[1]) if head.startswith(b"HTTP/") else None


def test_idle_connections_do_not_starve_the_probes():
    """16 idle connections (the bound), reopened as fast as the server closes them, while a prober asks
    `/healthz` 60 times: every probe is answered (with the newcomer closed at once while the bound was
    full, 7 of 60 were)."""
    server = start_metrics_server(new_registry(), ready=lambda: True, max_connections=16, read_timeout_s=5.0)
    stop = threading.Event()
    held: list[socket.socket] = []

    def hold_idle() -> None:
        while not stop.is_set():
            for s in list(held):  # reopen what the server closed
                s.setblocking(False)
                try:
                    if s.recv(1) == b"":
                        held.remove(s)
                        s.close()
                except BlockingIOError:
                    pass
                except OSError:
                    held.remove(s)
                    s.close()
            while len(held) < 16:
                held.append(socket.create_connection(("127.0.0.1", server.port)))
            time.sleep(0.005)

    holder = threading.Thread(target=hold_idle, daemon=True)
    holder.start()
    try:
        time.sleep(0.2)
        answers = []
        for _ in range(60):
            answers.append(_answer(server.port))
            time.sleep(0.05)
        assert answers.count(200) == 60, answers
        assert server.server.evicted > 0 and server.server.refused == 0
    finally:
        stop.set()
        holder.join(timeout=10)
        for s in held:
            s.close()
        server.close()


def test_connections_being_answered_are_not_shut_for_a_newcomer():
    """Four scrapes whose answer blocks (a collector waits on an event) hold the bound of 4: a newcomer is
    closed at once, and the four are answered once the collector returns."""
    from prometheus_client.registry import Collector

    release = threading.Event()

    class Slow(Collector):
        def collect(self):
            release.wait(30)
            return []

    registry = new_registry()
    release.set()  # registration collects once
    registry.register(Slow())
    release.clear()
    server = start_metrics_server(registry, max_connections=4, read_timeout_s=5.0)
    results: list[int | None] = []
    scrapes = [threading.Thread(target=lambda: results.append(_answer(server.port, "/metrics"))) for _ in range(4)]
    try:
        for t in scrapes:
            t.start()
        deadline = time.monotonic() + 10
        while sum(answering for _, answering in server.server._open.values()) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _answer(server.port) is None  # closed at once: all four are being answered
        assert server.server.refused == 1 and server.server.evicted == 0
        release.set()
        for t in scrapes:
            t.join(timeout=10)
        assert results == [200] * 4
    finally:
        release.set()
        server.close()
