"""The learner's composition function: `build_learner` hands every collaborator what it needs at
construction (the lease's token and check to the checkpointer and publisher, the dispatcher to the stream
source, the policy's vocabulary to the source and dispatcher, a weight transport always, one publisher
that the weight server serves), and a null object where a collaborator is not wanted."""

from __future__ import annotations

from types import SimpleNamespace

from searchr1.core.datasets import Question
from searchr1.learner.compose import build_learner
from searchr1.learner.dispatcher import Dispatcher
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.parts import NO_GUARD, NO_LEASE, NO_LINK, NO_SERVER, NoDispatcher, NoSource, RedisSide
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.stream import StreamSource
from searchr1.weightsync import SnapshotTransport


class _Lease:
    token = 7

    def check(self) -> None:
        pass


def test_build_learner_wires_every_collaborator_at_construction(tmp_path):
    import redis.asyncio as aioredis

    s = LearnerSettings(checkpoint={"dir": str(tmp_path / "ck")}, weights={"dir": str(tmp_path / "w")},
                        guard={"enabled": True})
    training = SimpleNamespace(trainer=SimpleNamespace(), vocab_size=lambda: 321)
    lease = _Lease()
    redis = aioredis.Redis()  # never connected: nothing here talks to Redis
    metrics = LearnerMetrics()
    learner = build_learner(s, training, metrics=metrics, redis=RedisSide(redis, lease=lease),  # type: ignore[arg-type]
                            tasks=[Question("q0", "question?", ["a"])])
    assert learner.checkpointer.fence == learner.publisher.fence == 7
    assert learner.checkpointer.lease is lease and learner.publisher.guard == lease.check
    assert isinstance(learner.dispatcher, Dispatcher) and learner.dispatcher.vocab_size == 321
    assert isinstance(learner.source, StreamSource)
    assert learner.source.dispatcher is learner.dispatcher and learner.source.vocab_size == 321
    assert isinstance(learner.transport, SnapshotTransport) and learner.transport.publisher is learner.publisher
    assert learner.guard is not None and learner.guard.events == tmp_path / "ck" / "guard-events.jsonl"


def test_without_redis_snapshots_are_written_through_the_same_transport(tmp_path):
    s = LearnerSettings(checkpoint={"dir": str(tmp_path / "ck")}, weights={"dir": str(tmp_path / "w")})
    learner = build_learner(s, SimpleNamespace(trainer=SimpleNamespace()))  # type: ignore[arg-type]
    assert isinstance(learner.transport, SnapshotTransport) and learner.transport.redis is None
    assert isinstance(learner.source, NoSource) and isinstance(learner.dispatcher, NoDispatcher)
    assert learner.guard is NO_GUARD and learner.lease is NO_LEASE and learner.link is NO_LINK
    assert learner.weights.server is NO_SERVER and learner.redis is None


def test_the_weight_server_serves_the_one_publisher_and_its_urls_name_it(tmp_path):
    s = LearnerSettings(checkpoint={"dir": str(tmp_path / "ck")},
                        weights={"dir": str(tmp_path / "w"), "http": True, "port": 0, "public_host": "learner-0"})
    learner = build_learner(s, SimpleNamespace(trainer=SimpleNamespace()))  # type: ignore[arg-type]
    server = learner.weights.server
    try:
        assert server is not NO_SERVER and learner.transport.publisher is learner.publisher
        assert learner.publisher.uri(3) == f"http://learner-0:{server.port}/weights/3"
    finally:
        server._sock.close()


def test_a_guard_needs_a_single_process_learner(tmp_path):
    import pytest

    from searchr1.learner.train.model import DistInfo

    s = LearnerSettings(checkpoint={"dir": str(tmp_path / "ck")}, weights={"dir": str(tmp_path / "w")},
                        guard={"enabled": True})
    with pytest.raises(ValueError, match="single-process"):
        build_learner(s, SimpleNamespace(trainer=SimpleNamespace()),  # type: ignore[arg-type]
                      info=DistInfo(rank=0, world=2))


def test_without_a_dispatcher_the_checkpoint_keeps_the_position_it_resumed_with():
    d = NoDispatcher()
    assert d.position() == {}  # a fresh run checkpoints the empty position, as TrainState's default
    d.restore({"epoch": 1, "cursor": 5}, 3)  # a replay resuming a live run's checkpoint
    assert d.position() == {"epoch": 1, "cursor": 5}
