"""The worker loop on a real Redis with a fake engine, retriever and scorer (fast, no vLLM): a scoring
failure leaves the task unacked, it is redelivered after the visibility timeout and published once;
a bad weight announcement (wrong sha256) is skipped and the worker keeps serving."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from searchr1.core.schemas import Task, WeightVersion
from searchr1.rollout.engine import TurnOutput, TurnRequest
from searchr1.rollout.metrics import RolloutMetrics
from searchr1.rollout.sampler import GroupSampler
from searchr1.rollout.settings import AgentSettings, RewardClientSettings, TaskSettings
from searchr1.rollout.worker import Worker
from searchr1.streams import StreamKeys, tasks_stream, trajectories_stream
from searchr1.weightsync import LoadSettings, WeightLoader, announce


class Codec:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class Gen:
    def __init__(self):
        self.reloads = []

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        text = "<answer> Paris </answer>"
        return TurnOutput([ord(c) for c in text], [-0.5] * len(text), text, "stop", "</answer>")

    async def reload(self, path, digest=None):
        self.reloads.append(path)

    async def close(self):
        pass


@dataclass
class FlakyScorer:
    failures: int = 1
    calls: int = 0

    async def score(self, scorer, items, params=None):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("reward service down")

        @dataclass
        class R:
            scores: list
            components: list

        return R([1.0] * len(items), [{"em": 1.0}] * len(items))


async def _search(q):
    return []


@dataclass
class Stack:
    worker: Worker
    tasks: object
    groups: object
    loader: WeightLoader
    metrics: RolloutMetrics


async def _stack(redis, keys: StreamKeys, gen, download_dir, scorer=None, *, visibility_timeout_ms: int = 60_000,
                 weight_poll_s: float = 2.0, **task_settings) -> Stack:
    """A worker over real Redis streams (consumer groups created), sampling with `gen`, scoring with
    `scorer` (every answer right by default), its weight loader downloading into `download_dir`;
    `task_settings`: its `[rollout.tasks]` (reads block 50 ms), and its heartbeat, watchdog, partial engine
    or fault hook."""
    metrics = RolloutMetrics()
    tasks = tasks_stream(redis, keys, visibility_timeout_ms=visibility_timeout_ms, max_deliveries=3)
    groups = trajectories_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    sampler = GroupSampler(gen, Codec(), None, _search, scorer or OkScorer(), AgentSettings(), RewardClientSettings(),
                           metrics)
    loader = WeightLoader(redis, keys, gen, download_dir, **metrics.loader_callbacks())
    worker_kw = {k: task_settings.pop(k) for k in ("heartbeat_s", "watchdog", "partial", "faults") if k in task_settings}
    worker = Worker(sampler, tasks, groups, loader, metrics, "w", TaskSettings(block_ms=50, **task_settings),
                    LoadSettings(poll_interval_s=weight_poll_s), **worker_kw)
    await tasks.ensure_group()
    await groups.ensure_group()
    return Stack(worker, tasks, groups, loader, metrics)


async def test_score_failure_is_redelivered_and_bad_weights_are_skipped(redis, tmp_path):
    keys = StreamKeys("wr")
    gen = Gen()
    scorer = FlakyScorer()
    st = await _stack(redis, keys, gen, tmp_path, scorer, visibility_timeout_ms=300, reclaim_interval_s=0.1,
                      weight_poll_s=0.05)
    worker, tasks, groups, loader, metrics = st.worker, st.tasks, st.groups, st.loader, st.metrics
    await tasks.publish(Task(task_id="a", question="capital of france", golden_answers=["Paris"], group_size=2))
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "model.safetensors").write_bytes(b"x")
    await announce(redis, keys, WeightVersion(version=3, uri=str(snap), sha256="0" * 64))  # wrong digest

    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    got = []
    end = time.monotonic() + 20
    while not got:
        assert time.monotonic() < end, "the task was never redone"
        got = await groups.read("t", count=5, block_ms=100)
    stop.set()
    await asyncio.wait_for(run, 10)
    assert [e.value.task.task_id for e in got] == ["a"]
    group = got[0].value
    assert group.rewards == [1.0, 1.0] and group.policy_version == 0
    assert scorer.calls == 2
    assert metrics.task_failures.labels("rollout")._value.get() == 1
    assert await tasks.pending() == 0
    assert gen.reloads == [] and loader.version == 0  # the unverifiable snapshot was not loaded


class OkScorer:
    async def score(self, scorer, items, params=None):
        @dataclass
        class R:
            scores: list
            components: list

        return R([1.0] * len(items), [{"em": 1.0}] * len(items))


async def test_a_task_needing_newer_weights_is_sampled_after_loading_them(redis, tmp_path):
    """Synchronous training: the learner announces version 1 and only then publishes the next tasks, stamped
    `min_policy_version=1`. The worker must not sample them with version 0 while waiting for its next weight
    poll (the learner would drop those groups as stale). A task read after an announcement starts under the
    announced weights whether or not it carries the stamp; one read before it keeps the version it started
    with."""
    from searchr1.weightsync import snapshot_digest

    keys = StreamKeys("mv")
    gen = Gen()
    st = await _stack(redis, keys, gen, tmp_path / "dl", weight_poll_s=3600.0)
    worker, tasks, groups, loader = st.worker, st.tasks, st.groups, st.loader
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))

    async def one_group():
        end = time.monotonic() + 20
        while True:
            assert time.monotonic() < end, "no group"
            got = await groups.read("t", count=5, block_ms=100)
            if got:
                assert len(got) == 1
                return got[0].value

    try:
        await asyncio.sleep(0.2)  # the worker has made its first (and, at 3600 s, last periodic) weight poll
        snap = tmp_path / "v1"
        snap.mkdir()
        (snap / "model.safetensors").write_bytes(b"weights v1")
        await tasks.publish(Task(task_id="before", question="q", golden_answers=["Paris"], group_size=2))
        assert (await one_group()).policy_version == 0 and gen.reloads == []  # nothing newer announced
        await announce(redis, keys, WeightVersion(version=1, uri=str(snap), sha256=snapshot_digest(snap)))
        await tasks.publish(Task(task_id="unstamped", question="q", golden_answers=["Paris"], group_size=2))
        group = await one_group()
        assert group.task.task_id == "unstamped" and group.policy_version == 1  # not at the poll, an hour away
        assert len(gen.reloads) == 1 and loader.version == 1
        snap2 = tmp_path / "v2"
        snap2.mkdir()
        (snap2 / "model.safetensors").write_bytes(b"weights v2")
        await announce(redis, keys, WeightVersion(version=2, uri=str(snap2), sha256=snapshot_digest(snap2)))
        await tasks.publish(Task(task_id="fresh", question="q", golden_answers=["Paris"], group_size=2,
                                 min_policy_version=2))
        group = await one_group()
        assert group.task.task_id == "fresh" and group.policy_version == 2
        assert len(gen.reloads) == 2 and loader.version == 2
    finally:
        stop.set()
        await asyncio.wait_for(run, 10)


class RecordingGen(Gen):
    def __init__(self):
        super().__init__()
        self.temperatures = []

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        self.temperatures.append(request.temperature)
        return await super().generate(request, request_id)


async def test_a_task_setting_the_default_temperature_is_not_overridden_and_the_group_records_it():
    """A task that sets temperature 1.0 (the value an unset field used to be read as) is sampled at 1.0
    by a worker configured for 0.7; a task leaving it unset is sampled at the worker's 0.7. Each group
    records the temperature it was sampled at."""
    from searchr1.core.schemas import SamplingParams

    gen = RecordingGen()
    agent = AgentSettings(temperature=0.7, top_p=0.9)
    sampler = GroupSampler(gen, Codec(), None, _search, OkScorer(), agent, RewardClientSettings(), RolloutMetrics())
    explicit = Task(task_id="e", question="q", group_size=2, sampling=SamplingParams(temperature=1.0, top_p=1.0))
    group = await sampler.sample_group(explicit, 0, "w", "e")
    assert group.sampling_temperature == 1.0 and set(gen.temperatures) == {1.0}
    gen.temperatures.clear()
    group = await sampler.sample_group(Task(task_id="u", question="q", group_size=2), 0, "w", "u")
    assert group.sampling_temperature == 0.7 and set(gen.temperatures) == {0.7}


def test_sampling_for_uses_the_worker_setting_only_for_unset_fields():
    from searchr1.core.schemas import SamplingParams
    from searchr1.rollout.sampler import limits_for, sampling_for

    agent = AgentSettings(temperature=0.7, top_p=0.9, top_k=40, max_tokens_per_turn=64)
    s = sampling_for(Task(task_id="t", question="q", sampling=SamplingParams(top_p=1.0, top_k=-1)), agent)
    assert (s.temperature, s.top_p, s.top_k) == (0.7, 1.0, -1)
    assert limits_for(Task(task_id="t", question="q"), agent).max_tokens_per_turn == 64


class HangingGen(Gen):
    """An engine whose turns never finish (a long generation when SIGTERM comes)."""

    def __init__(self):
        super().__init__()
        self.started = asyncio.Event()

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        self.started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_drain_past_its_timeout_cancels_and_leaves_the_task_for_redelivery(redis, tmp_path):
    """Stopping waits `drain_timeout_s` for the tasks in flight, then cancels them: the worker exits in time
    for its supervisor's grace period, nothing is published, and the task stays pending for another worker."""
    gen = HangingGen()
    st = await _stack(redis, StreamKeys("dr"), gen, tmp_path, weight_poll_s=3600.0, drain_timeout_s=0.5)
    worker, tasks, groups = st.worker, st.tasks, st.groups
    await tasks.publish(Task(task_id="long", question="capital of france", golden_answers=["Paris"], group_size=2))
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(gen.started.wait(), 20)
    stop.set()
    await asyncio.wait_for(run, 10)  # without the timeout the drain would wait forever
    assert await tasks.pending() == 1
    assert await groups.read("t", count=5, block_ms=50) == []


async def test_a_resync_request_reloads_the_announced_weights_at_the_same_version(redis, tmp_path):
    """The learner flagged this worker (its groups disagreed with the weights it claims): the worker takes the
    request at its next weight poll and reloads the announced snapshot although its version is the one it
    runs; the request is consumed, so it reloads once."""
    from searchr1.weightsync import request_resync, resync_key, snapshot_digest

    keys = StreamKeys("rs")
    gen = Gen()
    st = await _stack(redis, keys, gen, tmp_path / "dl", weight_poll_s=0.05)
    snap = tmp_path / "v1"
    snap.mkdir()
    (snap / "model.safetensors").write_bytes(b"weights v1")
    await announce(redis, keys, WeightVersion(version=1, uri=str(snap), sha256=snapshot_digest(snap)))
    stop = asyncio.Event()
    run = asyncio.create_task(st.worker.run(stop))
    try:
        end = time.monotonic() + 20
        while not gen.reloads:
            assert time.monotonic() < end, "the announced version was never loaded"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert len(gen.reloads) == 1 and st.loader.version == 1  # nothing newer: no second reload
        await request_resync(redis, keys, "w", "mean |Δ log p| 0.3, 30× its peers'")
        while len(gen.reloads) < 2:
            assert time.monotonic() < end, "the re-sync request was not honoured"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert len(gen.reloads) == 2 and st.loader.version == 1
        assert not await redis.exists(resync_key(keys, "w"))
    finally:
        stop.set()
        await asyncio.wait_for(run, 10)


async def test_a_stopped_worker_releases_the_tasks_it_abandons(redis, tmp_path):
    """Tasks a stopping worker abandons are released: another worker reclaims them at once (long before
    the 60 s visibility timeout), with their delivery count unchanged."""
    gen = HangingGen()
    keys = StreamKeys("rel")
    st = await _stack(redis, keys, gen, tmp_path, visibility_timeout_ms=60_000, weight_poll_s=3600.0,
                      drain_timeout_s=0.5)
    await st.tasks.publish(Task(task_id="long", question="capital of france", golden_answers=["Paris"], group_size=2))
    stop = asyncio.Event()
    run = asyncio.create_task(st.worker.run(stop))
    await asyncio.wait_for(gen.started.wait(), 20)
    stop.set()
    await asyncio.wait_for(run, 10)
    other = tasks_stream(redis, keys, visibility_timeout_ms=60_000, max_deliveries=3)
    taken = await other.reclaim("w2")
    assert [e.value.task_id for e in taken] == ["long"] and taken[0].deliveries == 2
    assert await other.release("w", [taken[0].id]) == 0  # no longer the stopped worker's: left alone
