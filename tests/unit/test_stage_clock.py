"""The stage clock (`searchr1.core.metrics.StageClock`): wall time split into stages that never overlap,
by priority, exposed as `…_stage_seconds_total{stage=…}`; and its use in the learner's and rollout's
metrics."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from searchr1.core.metrics import StageClock, StageCollector, in_stage, new_registry
from searchr1.learner.metrics import LearnerMetrics
from searchr1.rollout.metrics import RolloutMetrics, StagedGenerator, staged_search


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


def test_sequential_stages_and_idle_add_up_to_the_time_elapsed():
    t = FakeClock()
    c = StageClock(("a", "b"), idle="wait", clock=t)
    t.tick(1.0)  # idle
    with c.stage("a"):
        t.tick(2.0)
    t.tick(0.5)
    with c.stage("b"):
        t.tick(3.0)
    assert c.totals() == {"a": 2.0, "b": 3.0, "wait": 1.5}


def test_overlapping_stages_give_their_time_to_the_first_in_priority_order():
    t = FakeClock()
    c = StageClock(("gen", "search"), idle="idle", clock=t)
    c.enter("search")        # one trajectory waits on search ...
    t.tick(1.0)
    c.enter("gen")           # ... while another generates: generation
    t.tick(2.0)
    c.enter("gen")           # a second generating trajectory changes nothing
    t.tick(1.0)
    c.exit("gen")
    t.tick(1.0)
    c.exit("gen")            # only the search is left
    t.tick(4.0)
    c.exit("search")
    t.tick(0.25)
    assert c.totals() == {"gen": 4.0, "search": 5.0, "idle": 0.25}


def test_a_stage_nested_in_a_lower_priority_one_takes_its_time():
    t = FakeClock()
    c = StageClock(("optimizer", "train"), idle="other", clock=t)
    with c.stage("train"):
        t.tick(3.0)
        with c.stage("optimizer"):
            t.tick(1.0)
        t.tick(0.5)
    assert c.totals() == {"optimizer": 1.0, "train": 3.5, "other": 0.0}


def test_stages_are_left_when_the_body_raises():
    t = FakeClock()
    c = StageClock(("a",), clock=t)
    with pytest.raises(ValueError), c.stage("a"):
        t.tick(1.0)
        raise ValueError("boom")
    t.tick(2.0)
    assert c.totals() == {"a": 1.0, "idle": 2.0}


def test_bad_stage_use_is_an_error():
    with pytest.raises(ValueError, match="distinct"):
        StageClock(("a", "a"))
    with pytest.raises(ValueError, match="idle"):
        StageClock(("a", "idle"))
    c = StageClock(("a",))
    with pytest.raises(KeyError, match="unknown stage 'b'"):
        c.enter("b")
    with pytest.raises(RuntimeError, match="exited more often"):
        c.exit("a")


def test_concurrent_tasks_on_one_loop():
    """Real asyncio tasks entering across awaits: while any task generates, the time is generation's.
    The clock is advanced by the test between the tasks' steps, so the figures do not depend on the
    machine's load."""
    t = FakeClock()
    c = StageClock(("gen", "search"), idle="idle", clock=t)

    async def trajectory(gen_done: asyncio.Event, search_done: asyncio.Event) -> None:
        with c.stage("gen"):
            await gen_done.wait()
        with c.stage("search"):
            await search_done.wait()

    async def main() -> None:
        a_gen, a_search, b_gen, b_search = (asyncio.Event() for _ in range(4))
        tasks = [asyncio.create_task(trajectory(a_gen, a_search)), asyncio.create_task(trajectory(b_gen, b_search))]
        await asyncio.sleep(0)  # both tasks enter "gen" at t = 0
        for event, at in ((a_gen, 0.05), (b_gen, 0.15), (b_search, 0.20), (a_search, 0.25)):
            t.now = 100.0 + at
            event.set()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    totals = c.totals()
    # generation until 0.15 s (the second task), search alone from 0.15 to 0.25 s
    assert totals["gen"] == pytest.approx(0.15)
    assert totals["search"] == pytest.approx(0.10)
    assert totals["idle"] == pytest.approx(0.0)


def test_in_stage_decorates_sync_and_async_methods_and_skips_a_missing_clock():
    t = FakeClock()

    class Thing:
        def __init__(self, clock):
            self.clock = clock

        @in_stage("a", lambda self: self.clock)
        def work(self, seconds: float) -> str:
            t.tick(seconds)
            return "done"

        @in_stage("b", lambda self: self.clock)
        async def awork(self, seconds: float) -> str:
            t.tick(seconds)
            return "adone"

    c = StageClock(("a", "b"), clock=t)
    thing = Thing(c)
    assert thing.work(2.0) == "done"
    assert asyncio.run(thing.awork(3.0)) == "adone"
    assert c.totals() == {"a": 2.0, "b": 3.0, "idle": 0.0}
    assert Thing(None).work(1.0) == "done"
    assert Thing.work.__name__ == "work"


def test_collector_exposes_a_counter_per_stage_up_to_the_scrape():
    t = FakeClock()
    c = StageClock(("gen",), idle="queue_wait", clock=t)
    registry = new_registry()
    registry.register(StageCollector("searchr1_test_stage_seconds", "doc", c))
    c.enter("gen")
    t.tick(1.5)  # still generating at scrape time: counted up to now
    text = generate_latest(registry).decode()
    assert "# TYPE searchr1_test_stage_seconds_total counter" in text
    assert 'searchr1_test_stage_seconds_total{stage="gen"} 1.5' in text
    assert 'searchr1_test_stage_seconds_total{stage="queue_wait"} 0.0' in text


def test_learner_metrics_expose_stages_and_per_step_deltas():
    t = FakeClock()
    m = LearnerMetrics(clock=t)
    with m.stages.stage("queue_wait"):
        t.tick(2.0)
    with m.stages.stage("forward_backward"):
        t.tick(1.0)
        with m.stages.stage("optimizer"):
            t.tick(0.25)
    first = m.stage_seconds()
    assert first["queue_wait"] == 2.0 and first["forward_backward"] == 1.0 and first["optimizer"] == 0.25
    with m.stages.stage("checkpoint"):
        t.tick(0.5)
    second = m.stage_seconds()
    assert second["checkpoint"] == 0.5 and second["queue_wait"] == 0.0
    text = generate_latest(m.registry).decode()
    for stage in ("queue_wait", "forward_backward", "optimizer", "checkpoint", "archive", "weight_publish", "other"):
        assert f'searchr1_learner_stage_seconds_total{{stage="{stage}"}}' in text


def test_rollout_generation_and_search_run_in_their_stages():
    t = FakeClock()
    m = RolloutMetrics(clock=t)

    class Engine:
        reloaded = ""

        async def generate(self, request, request_id):
            t.tick(0.75)
            return f"out:{request}:{request_id}"

        async def reload(self, path, digest=None):
            self.reloaded = path

        async def close(self):
            pass

    async def search(query):
        t.tick(0.5)
        return [query]

    engine = Engine()
    gen = StagedGenerator(engine, m.stages)

    async def main():
        assert await gen.generate("req", "r0") == "out:req:r0"
        assert await staged_search(search, m.stages)("q") == ["q"]
        await gen.reload("/w")

    asyncio.run(main())
    assert engine.reloaded == "/w"
    totals = m.stages.totals()
    assert totals["generation"] == 0.75 and totals["search_wait"] == 0.5 and totals["queue_wait"] == 0.0
    text = generate_latest(m.registry).decode()
    assert 'searchr1_rollout_stage_seconds_total{stage="weight_reload"}' in text
