"""`free_port`: a port for a subprocess to bind later, drawn outside the kernel's ephemeral range so no
other process's bind(0) or outgoing connection can take it first."""

from __future__ import annotations

import socket

from searchr1.core import servers
from searchr1.core.servers import ephemeral_port_range, free_port, port_is_free


def test_ports_come_from_outside_the_ephemeral_range():
    lo, hi = ephemeral_port_range()
    ports = [free_port() for _ in range(50)]
    assert all(not lo <= p <= hi for p in ports), ports
    assert all(servers.LOWEST_FREE_PORT <= p <= 65535 for p in ports)
    assert all(port_is_free("127.0.0.1", p) for p in ports)


def test_range_read_from_the_kernel_file(tmp_path, monkeypatch):
    f = tmp_path / "range"
    f.write_text("20000\t64000\n")
    monkeypatch.setattr(servers, "EPHEMERAL_RANGE_FILE", f)
    assert ephemeral_port_range() == (20000, 64000)
    ports = {free_port() for _ in range(50)}
    assert all(p < 20000 or p > 64000 for p in ports), ports


def test_unreadable_range_falls_back_to_linux_default(tmp_path, monkeypatch):
    monkeypatch.setattr(servers, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ephemeral_port_range() == (32768, 60999)
    (tmp_path / "garbage").write_text("not a range")
    monkeypatch.setattr(servers, "EPHEMERAL_RANGE_FILE", tmp_path / "garbage")
    assert ephemeral_port_range() == (32768, 60999)


def test_a_range_covering_every_port_still_gives_a_free_one(tmp_path, monkeypatch):
    f = tmp_path / "range"
    f.write_text("1024 65535")
    monkeypatch.setattr(servers, "EPHEMERAL_RANGE_FILE", f)
    port = free_port()
    with socket.socket() as s:  # it can be bound
        s.bind(("127.0.0.1", port))


def test_a_taken_port_is_never_returned(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        monkeypatch.setattr(servers, "LOWEST_FREE_PORT", taken)
        monkeypatch.setattr(servers, "ephemeral_port_range", lambda: (taken + 1, 65535))
        assert free_port() != taken  # the one port outside the range is taken: bind(0) instead
