"""The learner's group sources without Redis: the archive source over a small written archive (steps in
order, steps trained before a resume skipped, stop honoured) and the stream source's filter (replays,
wrong temperature and stale groups set aside; replacements granted for untrained tasks only)."""

from __future__ import annotations

import asyncio
import random

from searchr1.learner.algo.staleness import StalenessPolicy
from searchr1.learner.metrics import LearnerMetrics
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.sources.archive import ArchiveSource
from searchr1.learner.sources.step_input import StepInput
from searchr1.learner.sources.stream import StreamSource
from searchr1.learner.tools.archive import ArchiveWriter
from searchr1.learner.train.checkpoint import TrainState
from searchr1.streams import Entry
from tests.support.synthetic import synthetic_group


def _groups(step: int, n: int = 2, version: int = 0):
    return [synthetic_group(f"s{step}-t{i}", group_size=2, rewards=[1.0, 0.0], policy_version=version,
                            rng=random.Random(step * 10 + i)) for i in range(n)]


def _archive(path, steps=(1, 2, 3)):
    w = ArchiveWriter(path, every_steps=2)
    for step in steps:
        w.append(step, _groups(step), [f"{step}-{i}" for i in range(2)])
    return path


async def _drain(source: ArchiveSource, state: TrainState, stop: asyncio.Event | None = None) -> list[list[str]]:
    stop = stop or asyncio.Event()
    got = []
    while (step := await source.next_step(stop, state)) is not None:
        assert step.entry_ids == [""] * len(step.groups)  # nothing to ack in an archive
        got.append([g.task.task_id for g in step.groups])
    return got


async def test_archive_source_hands_out_the_steps_in_order(tmp_path):
    source = ArchiveSource(_archive(tmp_path))
    await source.start()
    assert not await source.finished()
    steps = await _drain(source, TrainState())
    assert steps == [["s1-t0", "s1-t1"], ["s2-t0", "s2-t1"], ["s3-t0", "s3-t1"]]
    assert await source.finished()


async def test_archive_source_skips_the_steps_a_resumed_checkpoint_holds(tmp_path):
    source = ArchiveSource(_archive(tmp_path))
    await source.start()
    resumed = TrainState(step=2, version=2, consumed={"s1-t0", "s1-t1", "s2-t0"})
    # step 2 is only partly trained: it is replayed; step 1 is skipped
    assert await _drain(source, resumed) == [["s2-t0", "s2-t1"], ["s3-t0", "s3-t1"]]


async def test_archive_source_stops_when_asked(tmp_path):
    source = ArchiveSource(_archive(tmp_path))
    await source.start()
    stop = asyncio.Event()
    stop.set()
    assert await source.next_step(stop, TrainState()) is None
    assert not await source.finished()


class _Grants:
    def __init__(self) -> None:
        self.granted: list[tuple[int, int]] = []

    def grant(self, n: int, version: int) -> None:
        self.granted.append((n, version))


def test_stream_source_filter_sets_aside_replays_wrong_temperature_and_stale_groups():
    settings = LearnerSettings(algorithm={"max_staleness": 1}, batch={"groups_per_step": 4})
    grants = _Grants()
    source = StreamSource(settings, None, None, StalenessPolicy.from_settings(settings), LearnerMetrics(),
                          dispatcher=grants)
    source._state = TrainState(step=3, version=3, consumed={"s1-t0"})
    fresh, stale = _groups(1, version=3), _groups(2, version=1)
    hot = synthetic_group("hot", policy_version=3).model_copy(update={"sampling_temperature": 0.7})
    entries = [Entry("1-0", fresh[0]), Entry("1-1", fresh[1]), Entry("2-0", stale[0]), Entry("2-1", stale[1]),
               Entry("3-0", hot)]
    got = source.filter_groups(StepInput(entries=entries))
    assert [g.task.task_id for g in got.groups] == ["s1-t1"]
    assert [e.id for e in got.replays] == ["1-0"]
    assert [d.item.id for d in got.stale] == ["2-0", "2-1"]  # 2 versions behind, 1 allowed
    assert [d.item.id for d in got.wrong_temperature] == ["3-0"]
    assert got.group_entry_ids() == ["1-1"]
    assert grants.granted == [(3, 3)]  # the stale and the dead-lettered tasks; not the replay
    reg = source.metrics.registry
    for reason, n in (("replay", 1), ("stale", 2), ("temperature", 1)):
        assert reg.get_sample_value("searchr1_learner_groups_dropped_total", {"reason": reason}) == n
