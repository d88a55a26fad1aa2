"""The trajectory archive written by a real learner over a real Redis: exactly the trained groups, durable
before they are acked (a learner killed before acking, in this process or as a `kill -9`ed process, leaves
them archived, readable and pending), a step archived again after a restart told apart, and a replay of the
archive that trains without Redis or rollout."""

from __future__ import annotations

import asyncio
import json
import random

import pyarrow.compute as pc
import pytest
import torch

from searchr1.core.schemas import TrajectoryGroup
from searchr1.learner.compose import build_learner
from searchr1.learner.metrics import StepLog
from searchr1.learner.parts import Outputs, RedisSide
from searchr1.learner.service import Learner
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.tools.archive import ArchiveWriter, latest_copies, read
from searchr1.learner.train.build import build_training
from searchr1.learner.train.model import DistInfo
from searchr1.streams import StreamKeys, TypedStream, trajectories_stream
from tests.support.synthetic import synthetic_group, tiny_qwen2

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("model") / "tiny", vocab=256, hidden=64)


def _settings(tmp_path, redis_url, model_path, **over) -> LearnerSettings:
    base = {
        "redis": {"url": redis_url, "run": "t"},
        "model": {"path": str(model_path)},
        "algorithm": {"advantage": "grpo", "use_kl_loss": False},
        "optim": {"lr": 1e-2, "total_steps": 100},
        "batch": {"groups_per_step": 2, "micro_batch_size": 4, "max_seq_len": 64},
        "weights": {"dir": str(tmp_path / "weights"), "keep": 2},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "keep": 2},
        "archive": {"every_steps": 2},
        "log_dir": str(tmp_path / "logs"),
        "device": "cpu",
        "visibility_timeout_ms": 200,
        "read_block_ms": 100,
    }
    base.update(over)
    return LearnerSettings(**base)


def _learner(settings, redis, consumer="learner-0") -> Learner:
    settings = settings.model_copy(update={"consumer": consumer})
    training = build_training(settings, DistInfo())
    return build_learner(settings, training, redis=RedisSide(redis),
                         outputs=Outputs(StepLog(settings.log_dir / "t.jsonl"),
                                         ArchiveWriter(settings.archive_dir, settings.archive.every_steps)))


def _producer(redis) -> TypedStream[TrajectoryGroup]:
    return trajectories_stream(redis, StreamKeys("t"))


def _groups(prefix: str, n: int, version: int = 0) -> list[TrajectoryGroup]:
    rng = random.Random(prefix)
    return [synthetic_group(f"{prefix}{i}", group_size=4, rewards=[1.0, 0.0, 0.0, 1.0], policy_version=version,
                            rng=rng) for i in range(n)]


async def test_archive_holds_exactly_the_trained_groups_before_they_are_acked(tmp_path, redis, redis_server,
                                                                              model_path):
    settings = _settings(tmp_path, redis_server.url, model_path)
    assert settings.archive_dir == tmp_path / "archive"
    producer = _producer(redis)
    stop = asyncio.Event()
    learner = _learner(settings, redis)
    await learner.start()

    ids_a = await producer.publish_many(_groups("a", 2))
    assert await learner.step_once(stop)
    assert list(learner.stages) == ["train", "archive", "checkpoint", "ack"]
    # a stale group (version 0 after one update, max_staleness 0) is acked and not archived
    # (read first: the step reads one more group in its place)
    await producer.publish_many(_groups("old", 1, version=0))
    ids_b = await producer.publish_many(_groups("b", 2, version=1))
    assert await learner.step_once(stop)

    table = read(settings.archive_dir)
    assert [p.name for p in (tmp_path / "archive").iterdir()] == ["part-000000.parquet"]
    got = {(r["step"], r["task_id"], r["entry_id"]) for r in table.select(["step", "task_id", "entry_id"]).to_pylist()}
    assert got == {(1, "a0", ids_a[0]), (1, "a1", ids_a[1]), (2, "b0", ids_b[0]), (2, "b1", ids_b[1])}
    assert table.num_rows == 16
    row = table.filter(pc.equal(table.column("task_id"), "b1")).to_pylist()[2]
    sent = _groups("b", 2, version=1)[1]
    assert row["policy_version"] == 1 and row["worker_id"] == "synthetic" and row["index"] == 2
    assert row["response_ids"] == sent.trajectories[2].response_ids
    assert row["loss_mask"] == sent.trajectories[2].loss_mask

    # killed before the ack: the step is archived (third step: a new part) and its groups still pending
    await producer.publish_many(_groups("c", 2, version=2))

    async def killed():
        raise RuntimeError("killed before ack")

    learner.ack = killed
    with pytest.raises(RuntimeError, match="killed before ack"):
        await learner.step_once(stop)
    assert await producer.pending() == 2
    assert list(learner.stages)[-2:] == ["archive", "checkpoint"]
    third = read(settings.archive_dir)
    assert sorted(set(third.filter(pc.equal(third.column("step"), 3)).column("task_id").to_pylist())) == ["c0", "c1"]
    assert sorted(p.name for p in (tmp_path / "archive").iterdir()) == ["part-000000.parquet", "part-000001.parquet"]


async def test_a_step_archived_again_after_a_restart_is_told_apart(tmp_path, redis, redis_server, model_path):
    """Checkpoints every 2 steps: a learner killed after archiving step 1 resumes from no checkpoint,
    re-reads the same groups and archives step 1 again, in a new part."""
    settings = _settings(tmp_path, redis_server.url, model_path, checkpoint={"dir": str(tmp_path / "ckpt"),
                                                                            "every": 2})
    producer = _producer(redis)
    stop = asyncio.Event()
    await producer.publish_many(_groups("a", 2))
    first = _learner(settings, redis, "learner-a")
    await first.start()
    assert await first.step_once(stop)
    assert await producer.pending() == 2 and "checkpoint" not in first.stages
    del first

    await asyncio.sleep(0.3)  # past the visibility timeout
    second = _learner(settings, redis, "learner-b")
    assert (await second.start()).step == 0
    assert await second.step_once(stop)
    table = read(settings.archive_dir)
    assert table.num_rows == 16
    assert set(table.column("step").to_pylist()) == {1}
    kept = latest_copies(table)
    assert kept.num_rows == 8 and set(kept.column("part").to_pylist()) == {1}


async def test_replay_trains_from_the_archive_without_redis(tmp_path, redis, redis_server, model_path):
    settings = _settings(tmp_path, redis_server.url, model_path)
    producer = _producer(redis)
    learner = _learner(settings, redis)
    await learner.start()
    for step in range(3):
        await producer.publish_many(_groups(f"s{step}-", 2, version=step))
        assert await learner.step_once(asyncio.Event())
    trained = json.loads((tmp_path / "logs" / "t.jsonl").read_text().splitlines()[0])

    from searchr1.learner.process import run_learner, run_replay

    replay_dir = tmp_path / "replay"
    replayed = settings.model_copy(update={
        "redis": settings.redis.model_copy(update={"url": "redis://127.0.0.1:1/0"}),  # never contacted
        "archive": settings.archive.model_copy(update={"replay_from": settings.archive_dir}),
        "weights": settings.weights.model_copy(update={"dir": replay_dir / "weights"}),
        "checkpoint": settings.checkpoint.model_copy(update={"dir": replay_dir / "ckpt"}),
        "log_dir": replay_dir / "logs"})
    state = await asyncio.wait_for(run_learner(replayed, max_steps=2), timeout=240)  # what `train --replay` runs
    assert state.step == 2 and state.consumed == {"s0-0", "s0-1", "s1-0", "s1-1"}
    lines = [json.loads(line) for line in (replay_dir / "logs" / "t.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    # the same groups from the same initial weights: the same first-step loss as the live run
    assert lines[0]["loss"] == pytest.approx(trained["loss"], rel=1e-4, abs=1e-6)
    assert not (replay_dir / "archive").exists(), "a replay writes no archive"

    # resumed: the checkpointed steps are skipped, the rest replayed
    state = await asyncio.wait_for(run_replay(replayed), timeout=240)
    assert state.step == 3 and {"s2-0", "s2-1"} <= state.consumed


_KILLED_LEARNER = """
import asyncio, os, signal, sys
from searchr1.streams import connect
from searchr1.learner.tools.archive import ArchiveWriter
from searchr1.learner.train.checkpoint import Checkpointer
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.train.model import DistInfo
from searchr1.weightsync import WeightPublisher
from searchr1.learner.compose import build_learner
from searchr1.learner.parts import Outputs, RedisSide
from searchr1.learner.train.build import build_training
from searchr1.learner.settings import LearnerSettings

async def main():
    s = LearnerSettings.model_validate_json(sys.argv[1])
    redis = connect(s.redis.url)
    learner = build_learner(s, build_training(s, DistInfo()), redis=RedisSide(redis),
                            outputs=Outputs(archive=ArchiveWriter(s.archive_dir, s.archive.every_steps)))
    learner.checkpoint = lambda: os.kill(os.getpid(), signal.SIGKILL)  # dies between archive and ack
    await learner.start()
    await learner.step_once(asyncio.Event())

asyncio.run(main())
"""


async def test_learner_killed_between_archive_and_ack_leaves_a_readable_archive(tmp_path, redis, redis_server,
                                                                                model_path):
    import os
    import signal
    import sys

    settings = _settings(tmp_path, redis_server.url, model_path)
    producer = _producer(redis)
    ids = await producer.publish_many(_groups("k", 2))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_LEARNER, settings.model_dump_json(), env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=240)
    assert proc.returncode == -signal.SIGKILL, out.decode(errors="replace")[-3000:]
    assert await producer.pending() == 2, "killed before the ack: both groups still pending"
    assert sorted(p.name for p in settings.archive_dir.iterdir()) == ["part-000000.parquet"]
    table = read(settings.archive_dir)
    assert {(r["task_id"], r["entry_id"]) for r in table.select(["task_id", "entry_id"]).to_pylist()} == {
        ("k0", ids[0]), ("k1", ids[1])}
    assert table.num_rows == 8 and set(table.column("step").to_pylist()) == {1}
