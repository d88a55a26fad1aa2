"""The learner's composition root: `build_learner` hands every collaborator what it needs at construction
(the lease's token and check to the checkpointer and publisher, the dispatcher to the stream source, the
policy's vocabulary to the source and dispatcher, a weight transport always)."""

from __future__ import annotations

from types import SimpleNamespace

from searchr1.core.datasets import Question
from searchr1.learner.dispatcher import Dispatcher
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.process import build_learner
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
    learner = build_learner(s, training, metrics=metrics, redis=redis, lease=lease,  # type: ignore[arg-type]
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
    assert learner.source is None and learner.dispatcher is None and learner.guard is None
