"""The policy's vocabulary size travels with the task, and the schema bounds a group's token ids by it: the
dispatcher stamps it, the worker's group carries it, and a group with an id past it fails validation (and
decoding) with a message naming the trajectory, the position and the bound."""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import pytest
from pydantic import ValidationError

from searchr1.core.schemas import (
    SCHEMA_VERSION,
    SchemaError,
    Task,
    Trajectory,
    TrajectoryGroup,
    decode,
    encode,
)


def _group(vocab_size: int | None, response_ids: list[int], prompt_ids: tuple[int, ...] = (1, 2)) -> TrajectoryGroup:
    ok = Trajectory(prompt_ids=[1], response_ids=[3], loss_mask=[1], behavior_logprobs=[-0.1])
    bad = Trajectory(prompt_ids=list(prompt_ids), response_ids=response_ids, loss_mask=[1] * len(response_ids),
                     behavior_logprobs=[-0.1] * len(response_ids))
    return TrajectoryGroup(task=Task(task_id="t", question="q?", vocab_size=vocab_size), policy_version=0,
                           sampling_temperature=1.0, worker_id="w", trajectories=[ok, bad])


def test_a_token_id_at_or_past_the_vocabulary_fails_validation_with_a_clear_message():
    assert _group(100, [5, 99]).task.vocab_size == 100  # the last id of the vocabulary is in it
    with pytest.raises(ValidationError, match=r"trajectory 1: response_ids\[1\] = 100 is outside the vocabulary "
                                              r"\[0, 100\) of the task's policy"):
        _group(100, [5, 100, 7])
    with pytest.raises(ValidationError, match=r"trajectory 1: prompt_ids\[0\] = 150000 is outside"):
        _group(32_000, [5], prompt_ids=(150_000, 1))
    assert _group(None, [150_000]).trajectories[1].response_ids == [150_000]  # unbounded without a size


def test_a_decoded_group_past_the_vocabulary_is_a_schema_error():
    payload = encode(_group(None, [5, 100]))
    envelope = msgpack.unpackb(payload, raw=False)
    envelope["data"]["task"]["vocab_size"] = 100  # a worker that ignored the bound
    with pytest.raises(SchemaError, match=r"(?s)invalid TrajectoryGroup: .*response_ids\[1\] = 100 is outside"):
        decode(TrajectoryGroup, msgpack.packb(envelope, use_bin_type=True))


def test_a_task_written_without_the_field_still_reads():
    old = {"v": SCHEMA_VERSION, "kind": "Task", "data": {"task_id": "t", "question": "q?"}}
    assert decode(Task, msgpack.packb(old, use_bin_type=True)).vocab_size is None
    assert decode(Task, encode(Task(task_id="t", question="q?", vocab_size=151_936))).vocab_size == 151_936
    with pytest.raises(ValidationError):
        Task(task_id="t", question="q?", vocab_size=0)


def test_the_dispatcher_stamps_the_policys_vocabulary_on_every_task():
    from searchr1.learner.dispatcher import Dispatcher
    from searchr1.learner.settings import DispatcherSettings
    from searchr1.learner.tools.data import Question

    specs = [Question(f"q{i}", f"question {i}", ["a"]) for i in range(3)]
    d = Dispatcher(None, specs, DispatcherSettings(epochs=2), vocab_size=151_936)
    assert {d._next().vocab_size for _ in range(5)} == {151_936}
    assert Dispatcher(None, specs, DispatcherSettings())._next().vocab_size is None


class _Codec:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class _Gen:
    async def generate(self, request, request_id):
        from searchr1.rollout.engine import TurnOutput

        text = "<answer> Paris </answer>"  # ids are the characters' code points, all below 128
        return TurnOutput([ord(c) for c in text], [-0.5] * len(text), text, "stop", "</answer>")


class _Scorer:
    async def score(self, scorer, items, params=None):
        @dataclass
        class R:
            scores: list
            components: list

        return R([1.0] * len(items), [{}] * len(items))


async def _no_search(query):
    return []


async def test_the_worker_group_carries_the_tasks_vocabulary_and_is_bounded_by_it():
    from searchr1.rollout.metrics import RolloutMetrics
    from searchr1.rollout.sampler import GroupSampler
    from searchr1.rollout.settings import AgentSettings, RewardClientSettings

    sampler = GroupSampler(_Gen(), _Codec(), None, _no_search, _Scorer(), AgentSettings(), RewardClientSettings(),
                           RolloutMetrics())
    group = await sampler.sample_group(Task(task_id="t", question="q?", group_size=2, vocab_size=128), 0, "w", "t")
    assert group.task.vocab_size == 128
    assert decode(TrajectoryGroup, encode(group)).task.vocab_size == 128  # what the learner reads
    with pytest.raises(ValidationError, match="is outside the vocabulary"):  # an engine past the policy's vocabulary
        await sampler.sample_group(Task(task_id="u", question="q?", group_size=2, vocab_size=100), 0, "w", "u")
