"""The fault suite's test hooks (`searchr1.core.faults`): off without their variable, the n-th time with
`name@n`, once across processes with a marker; `poisoned` changes one token id and nothing else."""

from __future__ import annotations

import random

import pytest

from searchr1.core import faults
from searchr1.core.faults import POISON_TOKEN_ID, fault_fires, poisoned
from searchr1.core.schemas import TrajectoryGroup, decode, encode
from tests.support.synthetic import synthetic_group


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(faults, "_reached", {})


def test_off_without_the_variable(monkeypatch):
    monkeypatch.delenv(faults.ENV_POINT, raising=False)
    assert not any(fault_fires("rollout.poison_group") for _ in range(5))


def test_fires_the_nth_time_only(monkeypatch):
    monkeypatch.setenv(faults.ENV_POINT, "rollout.poison_group@3")
    monkeypatch.delenv(faults.ENV_MARKER, raising=False)
    assert [fault_fires("rollout.poison_group") for _ in range(5)] == [False, False, True, False, False]
    assert not fault_fires("learner.after_archive")


def test_marker_makes_it_once_across_processes(monkeypatch, tmp_path):
    marker = tmp_path / "fired"
    monkeypatch.setenv(faults.ENV_POINT, "rollout.poison_group")
    monkeypatch.setenv(faults.ENV_MARKER, str(marker))
    assert fault_fires("rollout.poison_group")
    assert marker.read_text().startswith("rollout.poison_group pid ")
    monkeypatch.setattr(faults, "_reached", {})  # another process (or a restart) reaching it first
    assert not fault_fires("rollout.poison_group")


def test_poisoned_group_passes_the_schema_with_one_token_changed(monkeypatch):
    group = synthetic_group("t", group_size=2, vocab=64, rng=random.Random(0))
    monkeypatch.delenv(faults.ENV_POINT, raising=False)
    assert poisoned(group) is group
    monkeypatch.setenv(faults.ENV_POINT, "rollout.poison_group")
    monkeypatch.delenv(faults.ENV_MARKER, raising=False)
    bad = decode(TrajectoryGroup, encode(poisoned(group)))  # schema-valid on the wire
    assert bad.trajectories[0].response_ids == [POISON_TOKEN_ID, *group.trajectories[0].response_ids[1:]]
    assert bad.trajectories[1] == group.trajectories[1] and bad.task == group.task
