"""The audit's reading of a dead letter's task id (`tools/audit_sources.dead_task_id`): from the validated
payload, from the envelope of a payload the schema refused, and None for garbage or a payload whose task
id is not one."""

from __future__ import annotations

import msgpack

from searchr1.core.schemas import SCHEMA_VERSION, Task, TrajectoryGroup, encode
from searchr1.learner.tools.audit_sources import dead_task_id
from tests.support.synthetic import synthetic_group


def _refused_group(task_id: str) -> bytes:
    g = synthetic_group(task_id, group_size=2, vocab=128)
    t = g.trajectories[0]
    bad = t.model_copy(update={"response_ids": [1 << 30, *t.response_ids[1:]]})
    return encode(g.model_copy(update={"task": g.task.model_copy(update={"vocab_size": 128}),
                                       "trajectories": [bad, *g.trajectories[1:]]}))


def _envelope(kind: str, data: object) -> bytes:
    return msgpack.packb({"v": SCHEMA_VERSION, "kind": kind, "data": data}, use_bin_type=True)


def test_a_valid_payload_gives_its_task_id():
    g = synthetic_group("q7@e0", group_size=2, vocab=128)
    assert dead_task_id(TrajectoryGroup, encode(g)) == "q7@e0"
    assert dead_task_id(Task, encode(g.task)) == "q7@e0"


def test_a_payload_the_schema_refused_still_names_its_task():
    assert dead_task_id(TrajectoryGroup, _refused_group("q8@e1")) == "q8@e1"
    assert dead_task_id(Task, _envelope("Task", {"task_id": "q9@e0", "question": None})) == "q9@e0"


def test_garbage_and_non_task_ids_give_none():
    assert dead_task_id(TrajectoryGroup, b"\x00not msgpack") is None
    assert dead_task_id(TrajectoryGroup, b"") is None
    assert dead_task_id(TrajectoryGroup, _envelope("Task", {"task_id": "q1"})) is None  # another kind
    assert dead_task_id(TrajectoryGroup, _envelope("TrajectoryGroup", {"task": "q1"})) is None
    assert dead_task_id(Task, _envelope("Task", {"task_id": "has space"})) is None
    assert dead_task_id(Task, _envelope("Task", {"task_id": 7})) is None
    assert dead_task_id(Task, _envelope("Task", {"task_id": "x" * 257})) is None
    assert dead_task_id(Task, _envelope("Task", [1, 2])) is None
