"""Wire schemas shared by the services (docs/architecture.md, "Wire schemas") and their versioned
msgpack encoding.

A `TrajectoryGroup` is the unit of transport and of GRPO advantage: one stream entry = one group.

The loss-mask invariant, stated once: for every `Trajectory`, `loss_mask[i] == 1` exactly when
`response_ids[i]` was sampled by the policy, and 0 on every environment token (observations,
invalid-action text). `response_ids` are the ids the engine sampled, never a re-tokenisation of text.

Encoding: `encode(model)` writes a msgpack map `{"v": SCHEMA_VERSION, "kind": <type name>, "data": …}`.
`decode(kind_cls, raw)` checks version and kind and validates every field; anything wrong raises
`SchemaError` with a message, so a stream reader can dead-letter the entry instead of crashing.
Nothing is ever unpickled.

Versioning: `SCHEMA_VERSION` is bumped whenever a message's fields change meaning or a required field
is added, and a reader accepts only its own version, so an entry written by an older writer is
dead-lettered with the reason "schema version N is not supported" instead of being misread.
Version 2: `SamplingParams` fields are optional (None = the worker's setting; an explicit value,
the default included, is honoured), and `TrajectoryGroup.sampling_temperature` records the temperature
a group was sampled at. Version 3: `Trajectory.segments` records which weight version sampled which
response tokens (interruptible rollouts), and a group's `policy_version` is its oldest version. `Task.vocab_size`
(optional, so entries written without it read the same) bounds the token ids of the group that
answers the task.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any, Literal, TypeVar

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION = 3

FinishReason = Literal["answer", "eos", "max_turns", "length", "retriever_unavailable", "search_budget", "error"]
"""Why a trajectory ended: it answered; the model emitted EOS without an answer; it used every turn
without answering; a token limit was hit; the retriever could not be reached within the client's retries;
the run's web search budget was spent (the retriever answered FAILED_PRECONDITION); or the environment
failed otherwise (a refused search)."""

Split = Literal["train", "test", "validation"]

Segment = tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]
"""`(start, end, version)`: the response tokens `[start, end)` that weight version `version` sampled."""


class SchemaError(ValueError):
    """An encoded payload that is not a valid message of the expected kind and version."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=False)


class SamplingParams(_Wire):
    """Sampling parameters for one task's group: a value set here is used as is; None = the rollout
    worker's setting decides."""

    temperature: float | None = Field(default=None, ge=0.0, le=10.0)
    """Softmax temperature; 0 is greedy. None = the worker's setting."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    """Nucleus sampling mass. None = the worker's setting."""
    top_k: int | None = Field(default=None, ge=-1)
    """Top-k cut-off; -1 disables it. None = the worker's setting."""
    max_tokens_per_turn: int | None = Field(default=None, ge=1)
    """Per-turn generation budget; None uses the worker's setting."""
    seed: int | None = None
    """Optional seed for reproducible sampling."""


TRAINED_MAGNITUDE = 1e18
"""The largest magnitude of a trajectory's `reward` and of each behaviour log-prob: the learner trains on
them in float32 (at most 3.4e38), where a group's sum of rewards and PPO's squared returns must stay
finite too. A value past it would crash the learner's batch building (it does not fit float32) or turn a
step's loss to NaN; Search-R1's rewards are in [0, 1]."""

TASK_ID_PATTERN = r"^[^\s\x00-\x1f\x7f]+$"
"""A task id: printable characters, no whitespace (a newline in an id could forge a log line)."""


class Task(_Wire):
    """One question to roll out as a group of `group_size` trajectories."""

    task_id: str = Field(min_length=1, max_length=256, pattern=TASK_ID_PATTERN)
    """Unique id; makes replays idempotent (a learner never trains twice on one task id per epoch). No
    whitespace or control characters (`TASK_ID_PATTERN`): ids appear in log lines the audit reads back."""
    question: str = Field(min_length=1, max_length=16_384)
    """The question text, as in the dataset (the prompt template is applied by the rollout worker)."""
    golden_answers: list[str] = Field(default_factory=list, max_length=1024)
    """Accepted answers (Search-R1's `golden_answers` / `reward_model.ground_truth.target`)."""
    data_source: str = Field(default="unknown", max_length=128)
    """Dataset name (nq, hotpotqa, …), used to break metrics down."""
    group_size: int = Field(default=5, ge=1, le=1024)
    """G: trajectories sampled for this question."""
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    """Sampling parameters for the group."""
    split: Split = "train"
    """Dataset split the task comes from."""
    epoch: int = Field(default=0, ge=0)
    """Dispatcher epoch the task belongs to."""
    min_policy_version: int = Field(default=0, ge=0)
    """The oldest weight version the learner will still train this task's group on (its version when the
    task was published, minus `max_staleness`). A worker holding older weights loads the announced ones
    before sampling the task, instead of producing a group the learner would drop as stale."""
    metadata: dict[str, str] = Field(default_factory=dict)
    """Free-form string tags (question type, entity kind, …) carried through to the group."""
    vocab_size: int | None = Field(default=None, ge=1, le=1 << 31)
    """The policy's vocabulary size (its embedding's rows), set by the dispatcher: every token id of the
    group answering this task must be below it (`TrajectoryGroup` refuses one that is not). None: ids
    are only checked to be non-negative."""


class Trajectory(_Wire):
    """One sampled multi-turn trajectory. See the module docstring for the loss-mask invariant."""

    prompt_ids: list[int] = Field(min_length=1)
    """Token ids of the rendered prompt (chat template applied)."""
    response_ids: list[int]
    """Every token after the prompt: sampled tokens and environment tokens, in order."""
    loss_mask: list[Annotated[int, Field(ge=0, le=1)]]
    """1 where the policy sampled the token, 0 on environment tokens. Same length as response_ids."""
    behavior_logprobs: list[float]
    """Log-prob of each response token under the behaviour policy (0.0 where loss_mask is 0)."""
    reward: float = 0.0
    """Scalar reward used for training."""
    reward_components: dict[str, float] = Field(default_factory=dict)
    """Per-component breakdown (em, format, search_cost, …) that produced `reward`."""
    num_turns: int = Field(default=0, ge=0)
    """Generation turns taken."""
    num_searches: int = Field(default=0, ge=0)
    """Valid search actions issued."""
    finish_reason: FinishReason = "answer"
    """Why the trajectory ended."""
    response_text: str = ""
    """Decoded response (sampled + environment text), for scoring, logs and reading."""
    segments: list[Segment] = Field(default_factory=list)
    """Which weight version sampled which response tokens, as `(start, end, version)` spans in order,
    not overlapping, covering every token with loss mask 1 (environment tokens may fall inside or between
    them). Empty: every sampled token comes from the group's `policy_version` (whole-trajectory rollouts).
    More than one: the trajectory was interrupted by a weight swap and resumed (`partial_rollouts`)."""

    @model_validator(mode="after")
    def _lengths_agree(self) -> Trajectory:
        n = len(self.response_ids)
        if len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries, response_ids has {n}")
        if len(self.behavior_logprobs) != n:
            raise ValueError(f"behavior_logprobs has {len(self.behavior_logprobs)} entries, response_ids has {n}")
        if any(i < 0 for i in self.prompt_ids) or any(i < 0 for i in self.response_ids):
            raise ValueError("token ids must be non-negative")
        if not all(math.isfinite(x) and -TRAINED_MAGNITUDE <= x <= 1e-4 for x in self.behavior_logprobs):
            bad = next(x for x in self.behavior_logprobs
                       if not (math.isfinite(x) and -TRAINED_MAGNITUDE <= x <= 1e-4))
            raise ValueError(f"behavior_logprobs must be finite log-probabilities in [-{TRAINED_MAGNITUDE:g}, 0] "
                             f"(the range the learner trains in, float32), got {bad!r}")
        if not math.isfinite(self.reward):
            raise ValueError("reward must be finite")
        if abs(self.reward) > TRAINED_MAGNITUDE:
            raise ValueError(f"reward {self.reward!r} is outside [-{TRAINED_MAGNITUDE:g}, {TRAINED_MAGNITUDE:g}], "
                             "the range the learner trains in (float32)")
        if not all(math.isfinite(v) for v in self.reward_components.values()):
            raise ValueError("reward_components must be finite")
        if self.segments:
            _check_segments(self.segments, self.loss_mask)
        return self


def _check_segments(segments: list[Segment], loss_mask: list[int]) -> None:
    """Raise ValueError unless `segments` are in order, disjoint, inside the response and cover every
    token with loss mask 1."""
    covered = 0
    prev_end = 0
    for start, end, _ in segments:
        if not start < end <= len(loss_mask):
            raise ValueError(f"segment [{start}, {end}) is empty or past the response's {len(loss_mask)} tokens")
        if start < prev_end:
            raise ValueError(f"segment [{start}, {end}) overlaps or precedes the one ending at {prev_end}")
        covered += sum(loss_mask[start:end])
        prev_end = end
    if covered != sum(loss_mask):
        raise ValueError(f"segments cover {covered} of the {sum(loss_mask)} sampled (loss mask 1) tokens")


class TrajectoryGroup(_Wire):
    """All trajectories sampled for one task by one worker under one policy version."""

    task: Task
    """The task the group answers."""
    policy_version: int = Field(ge=0)
    """Weight version that generated every trajectory of the group; with interrupted trajectories (see
    `Trajectory.segments`), the oldest version that sampled any of its tokens."""
    sampling_temperature: float = Field(ge=0.0, le=10.0)
    """Softmax temperature every trajectory of the group was sampled at (the task's, or the worker's
    setting when the task left it unset)."""
    worker_id: str = Field(min_length=1, max_length=256)
    """Rollout worker that produced the group."""
    trajectories: list[Trajectory] = Field(min_length=1)
    """The G trajectories."""
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds spent per stage (generate, search, score, total)."""
    created_at: float = Field(default_factory=time.time)
    """Unix time the group was published."""

    @model_validator(mode="after")
    def _ids_in_vocabulary(self) -> TrajectoryGroup:
        """Every token id below the task's `vocab_size` (an id past it would index past the embedding)."""
        limit = self.task.vocab_size
        if limit is None:
            return self
        for i, t in enumerate(self.trajectories):
            for part, ids in (("prompt_ids", t.prompt_ids), ("response_ids", t.response_ids)):
                if ids and max(ids) >= limit:
                    at = next(j for j, x in enumerate(ids) if x >= limit)
                    raise ValueError(f"trajectory {i}: {part}[{at}] = {ids[at]} is outside the vocabulary "
                                     f"[0, {limit}) of the task's policy")
        return self

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]


class WeightVersion(_Wire):
    """A published policy snapshot announced by the learner (docs/architecture.md, "Weight sync")."""

    version: int = Field(ge=0)
    """Monotonic policy version (number of updates applied)."""
    uri: str = Field(min_length=1)
    """Where the safetensors snapshot lives: a directory path or an http(s) URL."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The snapshot's digest: the sha256 of its manifest of per-chunk BLAKE3 digests, which authenticates
    every byte loaded (`searchr1.weightsync`'s manifest)."""
    created_at: float = Field(default_factory=time.time)
    """Unix time of publication."""
    base: int | None = Field(default=None, ge=0)
    """None: `uri` names a full snapshot. Else `uri` names a delta that turns version `base` (always
    `version − 1`) into this one; a worker at another version starts from the newest full version
    (optional, so records written without it read as full snapshots)."""

    @model_validator(mode="after")
    def _delta_follows_base(self) -> WeightVersion:
        if self.base is not None and self.base != self.version - 1:
            raise ValueError(f"a delta of version {self.version} applies to version {self.version - 1}, not {self.base}")
        return self


M = TypeVar("M", bound=BaseModel)


def encode(model: BaseModel) -> bytes:
    """Serialise a wire model as versioned msgpack."""
    return msgpack.packb(
        {"v": SCHEMA_VERSION, "kind": type(model).__name__, "data": model.model_dump(mode="python")},
        use_bin_type=True,
    )


def read_envelope(cls: type[BaseModel], raw: bytes | bytearray | memoryview) -> Any:
    """The `data` of a payload written by `encode` for a `cls`, not validated (what `decode` validates;
    the audit reads a refused payload's task id from it); raise `SchemaError` on anything else."""
    try:
        envelope: Any = msgpack.unpackb(bytes(raw), raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise SchemaError(f"not msgpack: {exc}") from exc
    if not isinstance(envelope, dict) or set(envelope) != {"v", "kind", "data"}:
        raise SchemaError("payload is not a searchr1 envelope {v, kind, data}")
    if envelope["v"] != SCHEMA_VERSION:
        raise SchemaError(f"schema version {envelope['v']!r} is not supported (expected {SCHEMA_VERSION})")
    if envelope["kind"] != cls.__name__:
        raise SchemaError(f"expected a {cls.__name__}, got {envelope['kind']!r}")
    return envelope["data"]


def decode(cls: type[M], raw: bytes | bytearray | memoryview) -> M:
    """Parse and validate a payload written by `encode`; raise `SchemaError` on anything else."""
    data = read_envelope(cls, raw)
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise SchemaError(f"invalid {cls.__name__}: {exc}") from exc
