"""Wire schemas: validation and the versioned msgpack encoding."""

from __future__ import annotations

import msgpack
import pytest
from pydantic import ValidationError

from searchr1.core.schemas import (
    SCHEMA_VERSION,
    SamplingParams,
    SchemaError,
    Task,
    Trajectory,
    TrajectoryGroup,
    WeightVersion,
    decode,
    encode,
)


def traj(**kw) -> Trajectory:
    base = dict(prompt_ids=[1, 2], response_ids=[3, 4, 5], loss_mask=[1, 0, 1],
                behavior_logprobs=[-0.1, 0.0, -2.0], reward=1.0, num_turns=2, num_searches=1,
                finish_reason="answer", response_text="x")
    base.update(kw)
    return Trajectory(**base)


def group() -> TrajectoryGroup:
    task = Task(task_id="t1", question="who?", golden_answers=["a"], group_size=2)
    return TrajectoryGroup(task=task, policy_version=3, sampling_temperature=1.0, worker_id="w0",
                           trajectories=[traj(), traj(reward=0.0)])


def test_roundtrip_group():
    g = group()
    raw = encode(g)
    back = decode(TrajectoryGroup, raw)
    assert back == g
    assert back.rewards == [1.0, 0.0]
    assert sum(back.trajectories[0].loss_mask) == 2


def test_envelope_is_versioned():
    env = msgpack.unpackb(encode(group()))
    assert env["v"] == SCHEMA_VERSION and env["kind"] == "TrajectoryGroup"


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        (dict(loss_mask=[1, 0]), "loss_mask has 2 entries"),
        (dict(behavior_logprobs=[-0.1]), "behavior_logprobs has 1 entries"),
        (dict(loss_mask=[1, 2, 0]), "less than or equal to 1"),
        (dict(finish_reason="banana"), "finish_reason"),
        (dict(behavior_logprobs=[0.5, 0.0, 0.0]), "log-probabilities"),
        (dict(behavior_logprobs=[float("nan"), 0.0, 0.0]), "log-probabilities"),
        (dict(prompt_ids=[]), "prompt_ids"),
        (dict(response_ids=[-1, 2, 3]), "non-negative"),
        (dict(reward=float("inf")), "reward must be finite"),
    ],
)
def test_trajectory_validation(kw, msg):
    with pytest.raises(ValidationError, match=msg):
        traj(**kw)


def test_group_needs_trajectories_and_extra_fields_forbidden():
    task = Task(task_id="t", question="q")
    with pytest.raises(ValidationError):
        TrajectoryGroup(task=task, policy_version=0, sampling_temperature=1.0, worker_id="w", trajectories=[])
    with pytest.raises(ValidationError, match="sampling_temperature"):
        TrajectoryGroup(task=task, policy_version=0, worker_id="w", trajectories=[traj()])
    with pytest.raises(ValidationError, match="Extra inputs"):
        Task(task_id="t", question="q", colour="red")


def test_task_bounds():
    with pytest.raises(ValidationError):
        Task(task_id="t", question="")
    with pytest.raises(ValidationError):
        Task(task_id="t", question="q", group_size=0)
    with pytest.raises(ValidationError):
        Task(task_id="t", question="q", sampling={"top_p": 0.0})


@pytest.mark.parametrize(
    ("raw", "msg"),
    [
        (b"\xc1garbage", "not msgpack"),
        (msgpack.packb([1, 2]), "envelope"),
        (msgpack.packb({"v": 99, "kind": "Task", "data": {}}), "version 99"),
        (msgpack.packb({"v": SCHEMA_VERSION, "kind": "Task", "data": {}}), "expected a TrajectoryGroup"),
        (msgpack.packb({"v": SCHEMA_VERSION, "kind": "TrajectoryGroup", "data": {"x": 1}}), "invalid TrajectoryGroup"),
    ],
)
def test_decode_rejects_with_clear_error(raw, msg):
    with pytest.raises(SchemaError, match=msg):
        decode(TrajectoryGroup, raw)


def test_weight_version_digest_format():
    WeightVersion(version=1, uri="/x", sha256="0" * 64)
    with pytest.raises(ValidationError):
        WeightVersion(version=1, uri="/x", sha256="xyz")


def test_sampling_params_keep_unset_apart_from_explicit_defaults():
    """None = the worker decides; an explicit value equal to the old default survives the wire."""
    unset = decode(Task, encode(Task(task_id="t", question="q")))
    assert (unset.sampling.temperature, unset.sampling.top_p, unset.sampling.top_k) == (None, None, None)
    explicit = Task(task_id="t", question="q", sampling=SamplingParams(temperature=1.0, top_p=1.0, top_k=-1))
    back = decode(Task, encode(explicit)).sampling
    assert (back.temperature, back.top_p, back.top_k) == (1.0, 1.0, -1)


def test_entries_of_the_previous_schema_version_are_refused_with_the_reason():
    """A version-1 entry (sampling defaults written out, no sampling_temperature) is not misread as
    version 2: decoding fails with a reason a stream reader dead-letters."""
    data = group().model_dump(mode="python")
    del data["sampling_temperature"]
    raw = msgpack.packb({"v": 1, "kind": "TrajectoryGroup", "data": data}, use_bin_type=True)
    with pytest.raises(SchemaError, match=f"schema version 1 is not supported \\(expected {SCHEMA_VERSION}\\)"):
        decode(TrajectoryGroup, raw)


@pytest.mark.parametrize("task_id", ["a\nb", "lost\ndropping group of task x: stale", "a b", "t\x00", "\t", "a\rb"])
def test_task_ids_carry_no_whitespace_or_control_characters(task_id):
    with pytest.raises(ValidationError):
        Task(task_id=task_id, question="q")


def test_task_ids_take_printable_text():
    for task_id in ("nq-train-17", "hotpotqa/dev:3", "vraag-é", "a.b_c+d@e"):
        assert Task(task_id=task_id, question="q").task_id == task_id
