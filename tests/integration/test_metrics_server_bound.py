"""The metrics/probe server under half-sent requests, over real HTTP on loopback: connections that send
part of a request and stall hold at most `max_connections` threads (the rest are closed at once), each
is closed after `read_timeout_s` without a byte, and the server then answers scrapes and probes."""

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
        assert peak <= 1 + 4  # the serving thread and at most max_connections request threads
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
