"""The fault suite's hooks (`searchr1.core.faults`): the null hook never fires; an armed `FaultPoints` fires
the n-th time with `name@n`, once across processes with a marker; `poisoned` changes one token id and
nothing else; a process is armed from its environment only where the fault suite set it."""

from __future__ import annotations

import random

from searchr1.core.faults import NO_FAULTS, POISON_TOKEN_ID, FaultPoints, faults_from_env
from searchr1.core.schemas import TrajectoryGroup, decode, encode
from tests.support.synthetic import synthetic_group


def test_the_null_hook_never_fires():
    assert not any(NO_FAULTS.fires("rollout.poison_group") for _ in range(5))
    NO_FAULTS.kill_at("learner.after_archive")  # still alive


def test_fires_the_nth_time_only():
    faults = FaultPoints("rollout.poison_group@3")
    assert [faults.fires("rollout.poison_group") for _ in range(5)] == [False, False, True, False, False]
    assert not faults.fires("learner.after_archive")


def test_marker_makes_it_once_across_processes(tmp_path):
    marker = tmp_path / "fired"
    assert FaultPoints("rollout.poison_group", marker).fires("rollout.poison_group")
    assert marker.read_text().startswith("rollout.poison_group pid ")
    # another process (or a restart) with its own hook: the marker says it happened already
    assert not FaultPoints("rollout.poison_group", marker).fires("rollout.poison_group")


def test_armed_from_the_environment_only_when_set(tmp_path):
    assert faults_from_env({}) is NO_FAULTS
    armed = faults_from_env({"SEARCHR1_FAULT_POINT": "rollout.after_publish@2",
                             "SEARCHR1_FAULT_MARKER": str(tmp_path / "m")})
    assert isinstance(armed, FaultPoints)
    assert (armed.point, armed.marker) == ("rollout.after_publish@2", tmp_path / "m")
    assert [armed.fires("rollout.after_publish") for _ in range(3)] == [False, True, False]


def test_poisoned_group_passes_the_schema_with_one_token_changed():
    group = synthetic_group("t", group_size=2, vocab=64, rng=random.Random(0))
    assert NO_FAULTS.poisoned(group) is group
    bad = decode(TrajectoryGroup, encode(FaultPoints("rollout.poison_group").poisoned(group)))  # valid on the wire
    assert bad.trajectories[0].response_ids == [POISON_TOKEN_ID, *group.trajectories[0].response_ids[1:]]
    assert bad.trajectories[1] == group.trajectories[1] and bad.task == group.task


def test_switches_are_turned_on_and_off_from_outside(tmp_path):
    from searchr1.core.faults import FaultSwitches

    armed = faults_from_env({"SEARCHR1_FAULT_SWITCHES": str(tmp_path)})
    assert isinstance(armed, FaultSwitches) and armed.directory == tmp_path
    assert not armed.fires("checkpoint.slow_write") and armed.pause_s("checkpoint.slow_write") == 0.0
    (tmp_path / "checkpoint.slow_write").write_text("0.05\n")
    assert armed.fires("checkpoint.slow_write") and armed.pause_s("checkpoint.slow_write") == 0.05
    (tmp_path / "checkpoint.slow_write").write_text("not a number")
    assert armed.pause_s("checkpoint.slow_write") == 0.0
    (tmp_path / "checkpoint.slow_write").unlink()
    assert not armed.fires("checkpoint.slow_write")
    assert not armed.fires_for("rollout.poison_task", "q1@e0")
    (tmp_path / "rollout.poison_task").write_text("q1@e0\nq7@e2\n")
    assert armed.fires_for("rollout.poison_task", "q1@e0") and not armed.fires_for("rollout.poison_task", "q1@e1")
    assert not NO_FAULTS.fires_for("rollout.poison_task", "q1@e0") and NO_FAULTS.pause_s("x") == 0.0
