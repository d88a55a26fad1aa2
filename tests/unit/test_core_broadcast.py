"""The broadcast weight transport's wire layout and group (`searchr1.weightsync`'s broadcast wire): bucket plans, packing
round trips, URIs, and real gloo groups on loopback (receivers as threads of this process): tensors and
digest equal the sender's, a missing receiver raises instead of hanging, the next generation re-forms."""

from __future__ import annotations

import hashlib

import pytest
import torch

from searchr1.weightsync import Broadcaster, BroadcastFailed, DigestMismatch, Receiver, parse_group_uri
from searchr1.weightsync.broadcast import GroupAddress, group_uri
from searchr1.weightsync.buckets import pack_bucket, plan_buckets, unpack_bucket
from tests.support.broadcast import receive_in_thread


def test_plan_buckets_fills_up_to_the_limit_and_isolates_big_tensors():
    assert plan_buckets([4, 4, 4, 10, 1, 1], 8) == [[0, 1], [2], [3], [4, 5]]
    assert plan_buckets([], 8) == []
    assert plan_buckets([3], 1) == [[0]]
    with pytest.raises(ValueError):
        plan_buckets([1], 0)


def test_pack_unpack_round_trip_keeps_dtypes_shapes_values_and_hashes_the_packed_bytes():
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.tensor([1, -2], dtype=torch.int64)
    c = torch.tensor([[0.5]], dtype=torch.bfloat16)
    h = hashlib.sha256()
    flat = pack_bucket([a, b, c], h)
    assert flat.numel() == 32 + 16 + 16  # each tensor padded to 16 bytes
    assert h.hexdigest() == hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    specs = [{"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
             for n, t in (("a", a), ("b", b), ("c", c))]
    out = dict(unpack_bucket(flat, specs))
    assert torch.equal(out["a"], a) and torch.equal(out["b"], b) and torch.equal(out["c"], c)
    assert out["c"].dtype == torch.bfloat16
    with pytest.raises(DigestMismatch):
        unpack_bucket(flat[:-16], specs)


def test_group_uri_round_trip_and_rejects_other_uris():
    addr = GroupAddress("127.0.0.1", 29512, 3, 4)
    assert group_uri(addr, 17) == "broadcast://127.0.0.1:29512/3/4?version=17"
    assert parse_group_uri(group_uri(addr, 17)) == (addr, 17)
    for bad in ("file:///w/v1", "broadcast://h:1/0/1?version=1", "broadcast://h/0/2?version=1",
                "broadcast://h:1/x/2?version=1", "broadcast://h:1/0/2"):
        with pytest.raises(ValueError):
            parse_group_uri(bad)


def _named(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [("emb", torch.randn(50, 8, generator=g)), ("w", torch.randn(8, 8, generator=g).to(torch.bfloat16)),
            ("b", torch.randn(8, generator=g)), ("steps", torch.tensor([7]))]


def test_two_receivers_get_one_broadcast_with_the_senders_digest():
    bc = Broadcaster("127.0.0.1", 0, 3, backend="gloo", timeout_s=20, bucket_bytes=512)
    results = [{}, {}]
    threads = [receive_in_thread(Receiver(backend="gloo", timeout_s=20), bc.address, 5, r) for r in results]
    named = _named(0)
    digest = bc.send(5, named)
    for t in threads:
        t.join(30)
    for r in results:
        assert "error" not in r, r.get("error")
        assert r["digest"] == digest
        assert set(r["tensors"]) == {n for n, _ in named}
        for n, t in named:
            assert torch.equal(r["tensors"][n], t) and r["tensors"][n].dtype == t.dtype


def test_a_generation_forms_with_the_receivers_that_joined_and_a_refused_one_gets_into_the_next():
    """The first generation waits `timeout_s` for both receivers, then forms with the one that joined; a
    member that never takes part fails the send in time; the next generation forms within the join window
    from the receiver that joined; one refused by that closed generation is let into the one after."""
    import threading
    import time

    bc = Broadcaster("127.0.0.1", 0, 3, backend="gloo", timeout_s=3, bucket_bytes=1 << 20, join_window_s=1)
    lone = {}
    t = receive_in_thread(Receiver(backend="gloo", timeout_s=3), bc.address, 1, lone)
    digest = bc.send(1, _named(1))
    t.join(30)
    assert lone.get("digest") == digest and bc.members == 1 and bc.generation == 0

    # generation 1: two members, one of which joins and then never receives (a stopped worker)
    bc.generation, bc._pg = 1, None
    idle = Receiver(backend="gloo", timeout_s=3)
    threading.Thread(target=idle.join, args=(bc.address,), daemon=True).start()
    live = {}
    t = receive_in_thread(Receiver(backend="gloo", timeout_s=3), bc.address, 2, live)
    with pytest.raises(BroadcastFailed):
        bc.send(2, _named(2))
    t.join(30)
    assert bc.generation == 2

    # generation 2: only one receiver comes; it forms within the join window, not the timeout
    live = {}
    t = receive_in_thread(Receiver(backend="gloo", timeout_s=3), bc.address, 3, live)
    t0 = time.perf_counter()
    digest = bc.send(3, _named(3))
    formed_s = time.perf_counter() - t0
    t.join(30)
    assert live.get("digest") == digest and bc.members == 1 and formed_s < 3
    with pytest.raises(BroadcastFailed, match="closed"):
        Receiver(backend="gloo", timeout_s=3).join(bc.address)  # came back after the generation closed
    bc.refresh()  # short of a member and one waits: the next version opens generation 3
    assert bc.generation == 3
    results = [{}, {}]
    threads = [receive_in_thread(Receiver(backend="gloo", timeout_s=3), bc.address, 4, r) for r in results]
    digest = bc.send(4, _named(4))
    for th in threads:
        th.join(30)
    assert [r.get("digest") for r in results] == [digest, digest] and bc.members == 2
    bc.refresh()
    assert bc.generation == 3  # full: nothing to re-form


def test_a_late_joiner_of_a_full_group_is_refused():
    bc = Broadcaster("127.0.0.1", 0, 2, backend="gloo", timeout_s=20)
    first = {}
    t = receive_in_thread(Receiver(backend="gloo", timeout_s=20), bc.address, 1, first)
    bc.send(1, _named(1))
    t.join(30)
    assert first.get("digest")
    with pytest.raises(BroadcastFailed, match="closed|full"):
        Receiver(backend="gloo", timeout_s=5).join(bc.address)


def test_a_version_signed_without_the_runs_key_is_rejected():
    """A sender that took rank 0 without the run's secret cannot sign: the receiver refuses its version;
    the same transfer signed with the run's key is accepted."""
    for sender_key, accepted in ((b"stranger", False), (b"run-secret", True)):
        bc = Broadcaster("127.0.0.1", 0, 2, backend="gloo", timeout_s=20, key=sender_key)
        got: dict = {}
        t = receive_in_thread(Receiver(backend="gloo", timeout_s=20, key=b"run-secret"), bc.address, 3, got)
        digest = bc.send(3, _named(1))
        t.join(30)
        if accepted:
            assert "error" not in got and got["digest"] == digest
        else:
            assert isinstance(got.get("error"), DigestMismatch) and "not signed" in str(got["error"])
        bc.close()


def test_the_store_listens_only_on_the_configured_address():
    """Bound to 127.0.0.1, the store is not reachable on another local address (127.0.0.2)."""
    import socket

    bc = Broadcaster("127.0.0.1", 0, 2, backend="gloo", timeout_s=5)
    try:
        with socket.create_connection(("127.0.0.1", bc.port), timeout=5):
            pass
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", bc.port), timeout=5).close()
    finally:
        bc.close()


def test_the_broadcast_transport_announces_public_host_and_binds_host(tmp_path):
    """`weights.broadcast.public_host` is the address in the announced URI; the store still listens on
    `host` only."""
    import socket

    from searchr1.streams import StreamKeys
    from searchr1.weightsync import BroadcastTransport, PublishSettings, WeightPublisher, build_transport

    weights = PublishSettings(transport="broadcast", broadcast={"host": "127.0.0.1", "port": 0,
                                                                "public_host": "learner-0.learner"})
    transport = build_transport(weights, WeightPublisher(tmp_path / "w", keep=3), object(), StreamKeys("r"), None)
    assert isinstance(transport, BroadcastTransport)
    try:
        addr, version = parse_group_uri(transport.broadcaster.uri(4))
        assert (addr.host, addr.port, version) == ("learner-0.learner", transport.broadcaster.port, 4)
        with socket.create_connection(("127.0.0.1", transport.broadcaster.port), timeout=5):
            pass
    finally:
        transport.close()
    unset = build_transport(PublishSettings(transport="broadcast", broadcast={"host": "127.0.0.1", "port": 0}),
                            WeightPublisher(tmp_path / "w2", keep=3), object(), StreamKeys("r"), None)
    try:
        assert unset.broadcaster.uri(1).startswith("broadcast://127.0.0.1:")  # type: ignore[attr-defined]
    finally:
        unset.close()


def test_a_delta_on_the_wire_reaches_the_same_weights_and_a_bad_one_is_refused_without_leaving_the_group():
    """Versions 1–6 to a receiver that keeps its copy: 1 full; 2 a delta, bit-equal to the full version
    and a fraction of its bytes; 3 a delta onto a copy whose bits were flipped → refused by the checksum
    of the resulting tensor, the copy dropped and the receiver still in the group; 4 then goes out full
    (the receiver holds no copy); 5 a delta again; 6 a delta whose file is against another version than
    announced → refused as out of order."""
    import threading

    from searchr1.weightsync import DeltaRefused, DeltaSettings, VersionChain, WireDelta
    from searchr1.weightsync.safetensors import safetensors_bytes

    g = torch.Generator().manual_seed(3)
    states = [{"a": torch.randn(64, 64, generator=g).to(torch.bfloat16), "b": torch.randn(300, generator=g).to(torch.bfloat16)}]
    for _ in range(6):
        nxt = {k: v.clone() for k, v in states[-1].items()}
        nxt["a"].view(-1)[torch.randint(0, 4096, (40,), generator=g)] += 1.0
        states.append(nxt)
    bc = Broadcaster("127.0.0.1", 0, 2, backend="gloo", timeout_s=20)
    rx = Receiver(backend="gloo", timeout_s=20, keep_base=True)
    got: dict[int, object] = {}

    def run():
        rx.join(bc.address)
        for v in range(1, 7):
            if v == 3:
                rx.base.tensors["a"].view(-1)[7] += 1  # the held copy no longer is version 2
            try:
                got[v] = ({n: t.clone() for n, t in rx.receive(v)}, rx.last_form)
            except Exception as exc:  # noqa: BLE001 - reported to the test
                got[v] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    chain = VersionChain(DeltaSettings(max_share=0.9))
    forms, wire = {}, {}
    stale = None
    for v in range(1, 7):
        plan = chain.plan(v, states[v])
        delta = WireDelta(plan.base, safetensors_bytes(plan.delta, plan.delta_metadata)) if plan.delta else None
        if v == 3:
            stale = delta
        if v == 6:
            delta = WireDelta(5, stale.data)  # the file of 2→3, announced as 5→6
        bc.send(v, sorted(states[v].items()), sums=plan.sums, delta=delta)
        forms[v], wire[v] = bc.last_form, bc.last_bytes
    t.join(60)
    assert forms == {1: "full", 2: "delta", 3: "delta", 4: "full", 5: "delta", 6: "delta"}
    for v in (1, 2, 4, 5):
        tensors, form = got[v]
        assert form == forms[v] and all(torch.equal(tensors[n].view(torch.int16), states[v][n].view(torch.int16))
                                        for n in states[v])
    assert isinstance(got[3], DeltaRefused) and "checksum" in str(got[3])
    assert isinstance(got[6], DeltaRefused) and "out of order" in str(got[6])
    assert rx.rank == 1 and rx.base is None  # never left the group; the refused copy dropped
    assert wire[2] < wire[1] / 4


def test_the_rendezvous_counts_members_closes_atomically_and_counts_the_refused():
    """`rendezvous` on a real TCPStore: two of three configured receivers join, the learner's wait ends
    and the generation closes with two (world 3); a third is told it is closed and counted as waiting;
    a generation that every receiver joins closes at once, and one more is told it is full."""
    import time

    from searchr1.weightsync import rendezvous
    from searchr1.weightsync.broadcast import _store

    master = _store("127.0.0.1", 0, 5, is_master=True)
    client = _store("127.0.0.1", master.port, 5, is_master=False)
    assert [int(client.add("searchr1/weights/0/next_rank", 1)) for _ in range(2)] == [1, 2]
    t0 = time.perf_counter()
    members, seen = rendezvous.close_generation(master, 0, 3, wait_s=0.3)
    assert (members, seen) == (2, 0) and time.perf_counter() - t0 >= 0.3
    assert int(client.get("searchr1/weights/0/world")) == 3
    with pytest.raises(rendezvous.Refused, match="closed"):
        rendezvous.join_generation(client, 0, 3)
    assert rendezvous.someone_waits(master, seen) and not rendezvous.someone_waits(master, 1)

    assert int(client.add("searchr1/weights/1/next_rank", 1)) == 1
    t0 = time.perf_counter()
    assert rendezvous.close_generation(master, 1, 1, wait_s=30) == (1, 1)  # everyone in: no waiting
    assert time.perf_counter() - t0 < 5
    assert int(client.add("searchr1/weights/2/next_rank", 1)) == 1  # the one receiver of generation 2
    with pytest.raises(rendezvous.Refused, match="full"):
        rendezvous.join_generation(client, 2, 1)
    assert rendezvous.someone_waits(master, 1)


def test_a_reformation_that_stays_short_backs_off_before_the_next():
    """A waiting receiver that never joins the generation opened for it: the next re-formation waits one
    version (then two, four ...), so a receiver that keeps missing the join window does not cost the
    learner the window every version."""
    bc = Broadcaster("127.0.0.1", 0, 3, backend="gloo", timeout_s=2, bucket_bytes=1 << 20, join_window_s=0.5)
    rx = Receiver(backend="gloo", timeout_s=5)

    def send(version: int) -> None:
        import threading

        got: dict = {}

        def run():
            try:
                if rx.address != bc.address:
                    rx.join(bc.address)
                got["tensors"] = sum(1 for _ in rx.receive(version))
            except Exception as exc:  # noqa: BLE001 - reported to the test
                got["error"] = exc

        t = threading.Thread(target=run, daemon=True)
        t.start()
        bc.send(version, _named(version))
        t.join(30)
        assert "error" not in got, got.get("error")

    def refused() -> None:
        with pytest.raises(BroadcastFailed, match="closed"):
            Receiver(backend="gloo", timeout_s=2).join(bc.address)

    send(1)  # generation 0 forms with one of two receivers after timeout_s
    refused()
    bc.refresh()
    assert bc.generation == 1  # opened for the waiting receiver, which never comes
    send(2)
    assert bc.members == 1
    refused()
    bc.refresh()
    assert bc.generation == 1  # backing off: one version skipped
    send(3)
    bc.refresh()
    assert bc.generation == 2  # then re-formed again
