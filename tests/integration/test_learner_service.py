"""The learner against a real Redis: a scripted producer publishes groups, the learner trains on them,
announces new weight versions (fetchable from the shared directory and over HTTP), and a learner killed
before acking loses no group and never trains one twice."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch
from safetensors.torch import load_file

from searchr1.core.schemas import Task, TrajectoryGroup, decode
from searchr1.core.servers import HttpServer
from searchr1.learner.compose import build_learner
from searchr1.learner.metrics import LearnerMetrics, StepLog
from searchr1.learner.parts import Outputs, RedisSide
from searchr1.learner.service import Learner
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.build import build_training
from searchr1.learner.train.model import DistInfo
from searchr1.streams import StreamKeys, TypedStream, tasks_stream, trajectories_stream
from searchr1.weightsync import (
    WeightPublisher,
    announced_fence,
    fetch_snapshot,
    latest,
    snapshot_digest,
    weights_app,
)
from tests.support.synthetic import synthetic_group, tiny_qwen2

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("model") / "tiny", vocab=256, hidden=64)


def _settings(tmp_path, redis_url, model_path, **over) -> LearnerSettings:
    base = {
        "redis": {"url": redis_url, "run": "t"},
        "model": {"path": str(model_path)},
        "algorithm": {"advantage": "grpo", "use_kl_loss": True, "kl_loss_coef": 0.01},
        "optim": {"lr": 1e-2, "total_steps": 100},
        "batch": {"groups_per_step": 2, "micro_batch_size": 4, "max_seq_len": 64},
        "weights": {"dir": str(tmp_path / "weights"), "keep": 2},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "keep": 2},
        "log_dir": str(tmp_path / "logs"),
        "device": "cpu",
        "visibility_timeout_ms": 200,
        "read_block_ms": 100,
    }
    base.update(over)
    return LearnerSettings(**base)


def _learner(settings, redis, consumer="learner-0") -> Learner:
    settings = settings.model_copy(update={"consumer": consumer})
    metrics = LearnerMetrics()
    training = build_training(settings, DistInfo(), metrics.stages)
    return build_learner(settings, training, metrics=metrics, redis=RedisSide(redis),
                         outputs=Outputs(StepLog(settings.log_dir / "t.jsonl")))


def _producer(redis) -> TypedStream[TrajectoryGroup]:
    keys = StreamKeys("t")
    return trajectories_stream(redis, keys)


def _groups(prefix: str, n: int, version: int = 0) -> list[TrajectoryGroup]:
    rng = random.Random(prefix)
    return [synthetic_group(f"{prefix}{i}", group_size=4, rewards=[1.0, 0.0, 0.0, 1.0], policy_version=version,
                            rng=rng) for i in range(n)]


def _weights(path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


async def test_groups_train_publish_and_fetch(tmp_path, redis, redis_server, model_path):
    settings = _settings(tmp_path, redis_server.url, model_path)
    learner = _learner(settings, redis)
    await learner.start()
    v0 = await latest(redis, StreamKeys("t"))
    assert v0 is not None and v0.version == 0
    snap0 = await fetch_snapshot(v0, tmp_path / "dl")
    assert (snap0 / "config.json").is_file() and list(snap0.glob("model*.safetensors"))
    assert not list(snap0.glob("*optim*"))

    producer = _producer(redis)
    await redis.xadd(StreamKeys("t").trajectories, {b"m": b"not a group"})  # malformed: dead-lettered
    await producer.publish_many(_groups("a", 2))
    stop = asyncio.Event()
    assert await learner.step_once(stop)
    assert await redis.xlen(StreamKeys("t").dead) == 1
    assert learner.state.version == 1
    v1 = await latest(redis, StreamKeys("t"))
    assert v1.version == 1 and v1.uri == str(learner.publisher.path(1))
    snap1 = await fetch_snapshot(v1, tmp_path / "dl")
    w0, w1 = _weights(snap0), _weights(snap1)
    assert w0.keys() == w1.keys()
    assert any(not torch.equal(w0[k], w1[k]) for k in w0), "one update must change the weights"
    assert await producer.pending() == 0, "groups are acked once the step is checkpointed"
    assert learner.checkpointer.latest().name == "step00000001"
    line = json.loads((tmp_path / "logs" / "t.jsonl").read_text().splitlines()[-1])
    assert line["step"] == 1 and line["reward_mean"] == 0.5 and line["em_mean"] == 0.5
    assert line["by_source"]["unknown"]["reward_mean"] == 0.5
    assert {"loss", "pg_loss", "kl_loss", "entropy", "clip_frac", "grad_norm", "tokens_per_second"} <= set(line)
    reg = learner.metrics.registry
    assert reg.get_sample_value("searchr1_learner_steps_total") == 1
    assert reg.get_sample_value("searchr1_learner_policy_version") == 1

    # now served over HTTP: the announced uri is a URL and fetch_snapshot downloads and verifies it
    http = HttpServer(weights_app(learner.publisher))
    await http.start()
    try:
        learner.publisher.base_url = http.url
        await producer.publish_many(_groups("b", 2, version=1))
        assert await learner.step_once(stop)
        v2 = await latest(redis, StreamKeys("t"))
        assert v2.version == 2 and v2.uri == f"{http.url}/weights/2"
        got = await fetch_snapshot(v2, tmp_path / "http-dl")
        assert got != learner.publisher.path(2)
        assert snapshot_digest(got) == snapshot_digest(learner.publisher.path(2)) == v2.sha256
        import httpx

        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{http.url}/weights/99/files")).status_code == 404
            assert (await client.get(f"{http.url}/weights/2/files/..%2F..%2Fetc%2Fpasswd")).status_code == 404
    finally:
        await http.stop()
    # keep=2: version 0 was pruned
    assert learner.publisher.versions() == [1, 2]


async def test_killed_learner_loses_no_group_and_trains_none_twice(tmp_path, redis, redis_server, model_path):
    settings = _settings(tmp_path, redis_server.url, model_path)
    producer = _producer(redis)
    stop = asyncio.Event()

    # 1. learner A reads two groups and dies before training/acking them
    a = _learner(settings, redis, "learner-a")
    await a.start()
    await producer.publish_many(_groups("c", 2))
    read = await a.source.read_groups(stop)
    assert len(read.entries) == 2 and await producer.pending() == 2
    del a

    # 2. learner B re-reads them once idle past the visibility timeout and trains on them
    await asyncio.sleep(0.3)
    b = _learner(settings, redis, "learner-b")
    await b.start()
    assert await b.step_once(stop)
    assert b.state.step == 1 and {"c0", "c1"} <= b.state.consumed
    assert await producer.pending() == 0

    # 3. B trains on two more groups, checkpoints, and is killed before it acks them
    await producer.publish_many(_groups("d", 2, version=1))

    async def killed():
        raise RuntimeError("killed before ack")

    b.ack = killed
    with pytest.raises(RuntimeError, match="killed before ack"):
        await b.step_once(stop)
    assert await producer.pending() == 2
    trained_weights = _weights_from_ckpt(b)
    del b

    # 4. learner C resumes from the checkpoint, re-reads the two groups and acks them without retraining
    await asyncio.sleep(0.3)
    c = _learner(settings, redis, "learner-c")
    state = await c.start()
    assert state.step == 2 and {"d0", "d1"} <= state.consumed
    await c.step_once(stop)
    assert c.state.step == 2, "a replayed group must not be trained twice"
    assert await producer.pending() == 0
    assert c.metrics.registry.get_sample_value("searchr1_learner_groups_dropped_total", {"reason": "replay"}) == 2
    now = {k: v for k, v in c.training.trainer.policy.state_dict().items()}
    assert all(torch.equal(now[k], trained_weights[k]) for k in trained_weights)


def _weights_from_ckpt(learner) -> dict[str, torch.Tensor]:
    return load_file(str(learner.checkpointer.latest() / "policy.safetensors"))


async def test_stale_groups_are_dropped_and_counted(tmp_path, redis, redis_server, model_path):
    settings = _settings(tmp_path, redis_server.url, model_path, algorithm={"advantage": "grpo", "max_staleness": 1,
                                                                           "use_kl_loss": False})
    learner = _learner(settings, redis)
    await learner.start()
    learner.state.version = 5  # pretend five updates happened
    producer = _producer(redis)
    await producer.publish_many(_groups("old", 1, version=3) + _groups("new", 1, version=4)
                                + _groups("cur", 1, version=5))
    learner.s = learner.source.s = learner.s.model_copy(
        update={"batch": learner.s.batch.model_copy(update={"groups_per_step": 3})})
    step = asyncio.create_task(learner.step_once(asyncio.Event()))
    await asyncio.sleep(0.5)
    assert not step.done(), "a step short of a dropped group waits for its replacement"
    await producer.publish_many(_groups("more", 1, version=5))
    assert await asyncio.wait_for(step, 30)
    reg = learner.metrics.registry
    assert reg.get_sample_value("searchr1_learner_groups_dropped_total", {"reason": "stale"}) == 1
    assert reg.get_sample_value("searchr1_learner_groups_total") == 3
    assert learner.state.consumed == {"new0", "cur0", "more0"}
    assert await producer.pending() == 0


async def test_groups_sampled_at_another_temperature_are_dead_lettered(tmp_path, redis, redis_server,
                                                                      model_path):
    """A group sampled at 0.7 is never trained on (the learner's log-probs are at temperature 1): it goes
    to the dead stream with a reason naming both temperatures, counted, and the rest of the step trains."""
    from searchr1.streams import read_dead

    settings = _settings(tmp_path, redis_server.url, model_path)
    learner = _learner(settings, redis)
    await learner.start()
    producer = _producer(redis)
    hot = _groups("hot", 1)[0]
    hot.sampling_temperature = 0.7
    await producer.publish_many([hot] + _groups("ok", 2))
    learner.s = learner.source.s = learner.s.model_copy(
        update={"batch": learner.s.batch.model_copy(update={"groups_per_step": 2})})
    assert await learner.step_once(asyncio.Event())
    dead = await read_dead(redis, StreamKeys("t").dead)
    assert len(dead) == 1 and decode(TrajectoryGroup, dead[0].payload).task.task_id == "hot0"
    assert "temperature 0.7" in dead[0].reason and "temperature 1.0" in dead[0].reason
    reg = learner.metrics.registry
    assert reg.get_sample_value("searchr1_learner_groups_dropped_total", {"reason": "temperature"}) == 1
    assert reg.get_sample_value("searchr1_learner_groups_total") == 2
    assert learner.state.consumed == {"ok0", "ok1"} and await producer.pending() == 0


async def test_dispatcher_keeps_max_inflight(tmp_path, redis):
    from searchr1.learner.algo.staleness import StalenessPolicy
    from searchr1.learner.dispatcher import Dispatcher
    from searchr1.learner.settings import DispatcherSettings
    from searchr1.learner.tools.data import Question

    keys = StreamKeys("d")
    tasks = tasks_stream(redis, keys)
    await tasks.ensure_group()
    specs = [Question(f"q{i}", f"question {i}", ["a"]) for i in range(5)]
    d = Dispatcher(tasks, specs, DispatcherSettings(max_inflight=3, epochs=2, seed=7, group_size=5))
    assert await d.fill() == 3
    assert await d.fill() == 0
    assert await tasks.in_flight() == 3
    worker = await tasks.read("w", count=2)
    assert [e.value.group_size for e in worker] == [5, 5]
    assert await d.fill() == 0, "read but unacked tasks are still in flight"
    await tasks.ack(*[e.id for e in worker])
    assert await d.fill() == 2
    for _ in range(3):
        batch = await tasks.read("w", count=10)
        await tasks.ack(*[e.id for e in batch])
        await d.fill()
    assert d.exhausted

    paced_keys = StreamKeys("p")
    paced_stream = tasks_stream(redis, paced_keys)
    await paced_stream.ensure_group()
    policy = StalenessPolicy(max_staleness=0, groups_per_step=2, paced=True)
    paced = Dispatcher(paced_stream, specs, DispatcherSettings(max_inflight=10, epochs=2), staleness=policy)
    assert await paced.fill() == 2 and await paced.fill() == 0
    paced.grant(3, version=1)
    assert await paced.fill() == 3 and paced.budget == 0
    stamped = [decode(Task, f[b"m"]) for _, f in await redis.xrange(paced_keys.tasks)]
    assert [t.min_policy_version for t in stamped] == [0, 0, 1, 1, 1]
    assert all(t.sampling.temperature == 1.0 and t.sampling.top_p is None for t in stamped)
    rows = await redis.xrange(keys.tasks)
    ids = [decode(Task, f[b"m"]).task_id for _, f in rows]
    assert len(ids) == 10 and len(set(ids)) == 10
    assert sorted(i.split("@")[0] for i in ids[:5]) == [f"q{i}" for i in range(5)]
    assert all(i.endswith("@e0") for i in ids[:5]) and all(i.endswith("@e1") for i in ids[5:])


async def test_run_learner_end_to_end_with_dispatcher_and_http(tmp_path, redis, redis_server, model_path):
    """`run_learner` (what `searchr1 train` runs): the dispatcher feeds tasks, a scripted worker answers each
    with a group at the announced version, the learner trains two steps and serves its weights over HTTP."""
    from searchr1.learner.process import run_learner

    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"q{i}", "question": f"question {i}", "golden_answers": ["a"]})
                            + "\n" for i in range(6)))
    settings = _settings(tmp_path, redis_server.url, model_path,
                         dispatcher={"dataset": str(data), "max_inflight": 4, "group_size": 3, "poll_s": 0.05},
                         weights={"dir": str(tmp_path / "weights"), "http": True},
                         lease_ttl_ms=1000)  # shorter than loading the model: renewed from the acquire on
    keys = StreamKeys("t")
    tasks = tasks_stream(redis, keys)
    producer = _producer(redis)
    stop = asyncio.Event()
    seen: list[str] = []
    stamps: list[int] = []

    async def worker():
        await tasks.ensure_group()
        while not stop.is_set():
            for e in await tasks.read("w0", count=2, block_ms=50):
                wv = await latest(redis, keys)
                g = synthetic_group(e.value.task_id, group_size=e.value.group_size, rewards=[1.0, 0.0, 0.0],
                                    policy_version=wv.version if wv else 0)
                await producer.publish(g)
                await tasks.ack(e.id)
                seen.append(e.value.task_id)
                stamps.append(e.value.min_policy_version)

    w = asyncio.create_task(worker())
    try:
        state = await asyncio.wait_for(run_learner(settings, stop=stop, max_steps=2), timeout=240)
    finally:
        stop.set()
        await w
    assert state.step == 2 and state.version == 2
    assert len(state.consumed) == 4 and state.consumed <= set(seen)
    wv = await latest(redis, keys)
    assert wv.version == 2 and wv.uri.startswith("http://127.0.0.1:") and wv.uri.endswith("/weights/2")
    assert 6 * state.dispatcher["epoch"] + state.dispatcher["cursor"] >= 4
    steps = [json.loads(line) for line in (tmp_path / "logs" / "t.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    assert await redis.get("searchr1:t:learner:lease") is None  # released on the way out
    assert int(await redis.get("searchr1:t:learner:fence")) == 1 and await announced_fence(redis, keys) == 1
    # paced dispatcher (max_staleness 0): step 2's tasks were published after version 1 was announced,
    # so every group trained on was on-policy and none was dropped as stale
    assert [s["staleness_mean"] for s in steps] == [0.0, 0.0]
    assert all(s["malformed_rate"] == 1.0 and s["nonfinite_figures"] == 0.0 for s in steps)  # synthetic text: no tags
    assert len(seen) <= 6
    # and each task said so: the first step's tasks may be sampled with version 0, the second's need 1
    assert stamps[:2] == [0, 0] and all(v >= 1 for v in stamps[2:]) and len(stamps) > 2


async def test_run_learner_stops_when_the_dataset_is_exhausted(tmp_path, redis, redis_server, model_path):
    """One epoch of 3 tasks with 2 groups per step: a full step, then a last partial step, then exit."""
    from searchr1.learner.process import run_learner

    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"q{i}", "question": f"question {i}"}) + "\n" for i in range(3)))
    settings = _settings(tmp_path, redis_server.url, model_path,
                         dispatcher={"dataset": str(data), "epochs": 1, "group_size": 2, "poll_s": 0.05})
    keys = StreamKeys("t")
    tasks = tasks_stream(redis, keys)
    producer = _producer(redis)
    stop = asyncio.Event()

    async def worker():
        await tasks.ensure_group()
        while not stop.is_set():
            for e in await tasks.read("w0", count=4, block_ms=50):
                wv = await latest(redis, keys)
                await producer.publish(synthetic_group(e.value.task_id, group_size=2, rewards=[1.0, 0.0],
                                                       policy_version=wv.version if wv else 0))
                await tasks.ack(e.id)

    w = asyncio.create_task(worker())
    try:
        state = await asyncio.wait_for(run_learner(settings, stop=stop), timeout=240)
    finally:
        stop.set()
        await w
    assert state.step == 2 and state.consumed == {"q0@e0", "q1@e0", "q2@e0"}
    steps = [json.loads(line) for line in (tmp_path / "logs" / "t.jsonl").read_text().splitlines()]
    assert [s["groups"] for s in steps] == [2.0, 1.0]


class _SlowWandb:
    """A wandb run whose `log` blocks like a slow network sink."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.logged: list[int] = []

    def log(self, figures, step):
        import time

        time.sleep(self.seconds)
        self.logged.append(step)


class _SlowPrunePublisher(WeightPublisher):
    """Pruning that blocks like a slow shared volume."""

    pruned = 0

    def prune(self, keep_version=None):
        import time

        time.sleep(1.5)
        self.pruned += 1
        return super().prune(keep_version)


async def test_slow_pruning_and_step_log_sinks_do_not_block_the_event_loop(tmp_path, redis, redis_server,
                                                                           model_path):
    """A loop-lag probe ticks every 10 ms through a whole step whose snapshot pruning and wandb logging
    each block for 1.5 s: run on the loop, either would stall the probe (and the dispatcher) that long."""
    import time

    settings = _settings(tmp_path, redis_server.url, model_path)
    sink = _SlowWandb(1.5)
    publisher = _SlowPrunePublisher(settings.weights.dir, keep=settings.weights.keep)
    learner = build_learner(settings, build_training(settings, DistInfo()), publisher=publisher,
                            outputs=Outputs(StepLog(settings.log_dir / "t.jsonl", sink)), redis=RedisSide(redis))
    await learner.start()
    await _producer(redis).publish_many(_groups("lag", 2))
    gaps: list[float] = []
    done = asyncio.Event()

    async def probe():
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(probe())
    try:
        assert await learner.step_once(asyncio.Event())
    finally:
        done.set()
        await ticking
    assert sink.logged == [1] and publisher.pruned == 2  # at start (version 0) and after the step
    assert max(gaps) < 1.0, f"the event loop stalled for {max(gaps):.2f} s"


async def test_replays_are_not_granted_a_replacement_task(tmp_path, redis, redis_server, model_path):
    """A second group for a task already trained (a worker died between publishing it and acking its task)
    is acked as a replay without granting the dispatcher another task: its task was replaced when its
    first group trained. Granting for it put a paced dispatcher one task ahead of the weights for the rest
    of the run, and that task's group was dropped as stale every step. A stale group is replaced."""
    settings = _settings(tmp_path, redis_server.url, model_path, algorithm={"advantage": "grpo", "max_staleness": 0,
                                                                           "use_kl_loss": False})
    granted: list[tuple[int, int]] = []

    class Recorder:
        """Stands in for the dispatcher: records the grants (its budget is tested on its own above)."""

        exhausted = False
        budget = None

        def grant(self, n: int, version: int) -> None:
            if n:
                granted.append((n, version))

        def position(self) -> dict[str, int]:
            return {"epoch": 0, "cursor": 0}

        def restore(self, position: dict[str, int], version: int) -> None:
            pass

    settings = settings.model_copy(update={"consumer": "learner-0"})
    learner = build_learner(settings, build_training(settings, DistInfo()), redis=RedisSide(redis),
                            outputs=Outputs(StepLog(settings.log_dir / "t.jsonl")), dispatcher=Recorder())
    await learner.start()
    producer = _producer(redis)
    await producer.publish_many(_groups("a", 2))
    assert await learner.step_once(asyncio.Event())
    assert learner.state.consumed == {"a0", "a1"} and granted == [(2, 1)]  # two trained, two replaced

    granted.clear()
    again = _groups("a", 1, version=0)  # task a0's second group, sampled before its first was trained
    await producer.publish_many(again + _groups("old", 1, version=0) + _groups("b", 2, version=1))
    for _ in range(3):  # a read of only skipped groups ends a pass without a step
        await learner.step_once(asyncio.Event())
        if learner.state.step == 2:
            break
    assert learner.state.step == 2 and learner.state.consumed == {"a0", "a1", "b0", "b1"}
    reg = learner.metrics.registry
    assert reg.get_sample_value("searchr1_learner_groups_dropped_total", {"reason": "replay"}) == 1
    assert reg.get_sample_value("searchr1_learner_groups_dropped_total", {"reason": "stale"}) == 1
    # the stale group's task is replaced (1, at the filter), the trained ones after the step (2); the replay: none
    assert granted == [(1, 1), (2, 2)]
    assert await producer.pending() == 0


async def test_the_last_step_is_checkpointed_and_acked_off_the_cadence(tmp_path, redis, redis_server, model_path):
    """A run whose last step is not a multiple of `checkpoint.every` still checkpoints it and acks its groups:
    the run's final weights are resumable and nothing it trained stays pending."""
    settings = _settings(tmp_path, redis_server.url, model_path,
                         checkpoint={"dir": str(tmp_path / "ckpt"), "keep": 2, "every": 3},
                         algorithm={"advantage": "grpo", "max_staleness": 100})  # all 8 groups at version 0
    producer = _producer(redis)
    await producer.publish_many(_groups("e", 8))
    learner = _learner(settings, redis)
    await learner.start()
    state = await learner.run(asyncio.Event(), max_steps=4)
    assert state.step == 4
    assert sorted(p.name for p in learner.checkpointer.root.iterdir() if p.name.startswith("step")) == \
        ["step00000003", "step00000004"]
    assert await producer.pending() == 0
