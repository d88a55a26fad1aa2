"""Settings of the rollout service (`RolloutSettings`, env prefix `ROLLOUT_`, run-config table
`[rollout]`; nested fields via `__`, e.g. `ROLLOUT_AGENT__MAX_TURNS=2`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from searchr1.core.models import model_context_length
from searchr1.core.protocol import SEARCH_R1
from searchr1.core.settings import (
    RedisSettings,
    RetrySettings,
    RewardRetrySettings,
    Section,
    ServiceSettings,
    check_block_ms,
)
from searchr1.weightsync import LoadSettings


class EngineSettings(Section):
    kind: Literal["vllm", "hf"] = "vllm"
    """`vllm` (the real path) or `hf` (slow transformers fallback for machines without vLLM)."""
    gpu_memory_utilization: float = Field(default=0.08, gt=0.0, le=1.0)
    """Fraction of accelerator memory vLLM reserves (on the CPU build: of CPU memory)."""
    max_model_len: int = Field(default=4096, ge=64)
    """Context length (prompt + response) the engine allows; left unset, 4096 or the model's own
    (`max_position_embeddings`) if shorter."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Model dtype of the vLLM engine (`auto` = the checkpoint's; vLLM refuses one its device lacks, e.g.
    bfloat16 on a GPU before Ampere). Match the learner's `model.dtype` (float16 on both sides mismatches
    least: docs/learner.md, "Train–inference mismatch")."""
    enforce_eager: bool = True
    """Skip CUDA-graph / compile capture (starts much faster; set false on GPUs for speed)."""
    seed: int = 0
    """Engine seed."""
    max_num_seqs: int = Field(default=256, ge=1)
    """Sequences vLLM schedules at once."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs one engine spans."""
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = "processed_logprobs"
    """Which log-probs are recorded as behaviour log-probs: after temperature/top-p/top-k
    (`processed_logprobs`, the sampling distribution) or of the raw logits."""
    logits_processors: list[str] = Field(default_factory=list)
    """Fully-qualified vLLM logits-processor classes to load (e.g. the benchmark's steering policy)."""
    enable_prefix_caching: bool = True
    """Reuse KV of the shared prefix across turns and across the G samples of a task."""
    block_size: int | None = Field(default=None, ge=16)
    """KV-cache block size in tokens. The prefix cache serves whole blocks only, so each resumed turn
    recomputes the part of its context past the last full block. None: 32 on CPU (the smallest the CPU
    attention backend accepts; vLLM's own CPU default is 128, measured slower for the agent loop in
    docs/performance.md, "The agent loop against plain generation"), vLLM's default elsewhere (16 on CUDA)."""
    hf_threads: int | None = Field(default=None, ge=1)
    """torch threads for the `hf` fallback (None keeps torch's default)."""


class AgentSettings(Section):
    max_turns: int = Field(default=4, ge=0, le=64)
    """Turns that may search; one final answer-only turn follows."""
    max_tokens_per_turn: int = Field(default=500, ge=1)
    """Generation budget of one turn (a task's sampling may override it)."""
    max_obs_tokens: int = Field(default=500, ge=8)
    """Tokens one observation may take (truncation keeps `</information>`)."""
    max_response_tokens: int = Field(default=4096, ge=1)
    """Budget over the whole response, sampled + environment tokens (finish reason `length`)."""
    template: str = SEARCH_R1
    """Prompt template name from `searchr1.core.protocol.TEMPLATES`."""
    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    """Default temperature (a task's sampling params take precedence when they set one)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Default nucleus mass."""
    top_k: int = Field(default=-1, ge=-1)
    """Default top-k (-1: off)."""
    extra_args: dict[str, Any] = Field(default_factory=dict)
    """Passed to the engine with every turn (vLLM `SamplingParams.extra_args`, read by custom logits
    processors)."""


class RetrieverClientSettings(RetrySettings):
    """How this worker calls the retriever (the server's own settings are the retriever service's); the
    retry knobs are those of `RetrySettings`. When `deadline_s` runs out the trajectory ends with finish reason
    `retriever_unavailable`."""

    addresses: list[str] = Field(default_factory=lambda: ["127.0.0.1:50051"])
    """gRPC addresses (host:port) of retriever replicas, or http(s) URLs of servers speaking Search-R1's
    `POST /retrieve` (Search-R1's own retrieval_server.py, or ours on its HTTP port)."""
    token: str | None = None
    """Bearer token, if the retriever requires one."""
    top_k: int = Field(default=3, ge=1, le=100)
    """Passages per search (Search-R1: 3)."""
    max_batch: int = Field(default=64, ge=1)
    """Queries sent in one gRPC call at most."""
    max_wait_ms: float = Field(default=5.0, ge=0)
    """How long the first waiting query waits for others before its batch is sent."""
    max_query_chars: int = Field(default=4096, ge=1)
    """Queries are cut to this many characters (keep ≤ the retriever's `limits.max_query_chars`)."""


class RewardClientSettings(RewardRetrySettings):
    """How this worker calls the reward service (the server's own settings are the reward service's); the
    retry knobs are those of `RewardRetrySettings`. When `deadline_s` runs out the task stays unacked and is redelivered
    after the visibility timeout."""

    url: str = "http://127.0.0.1:8300"
    """Base URL of the reward service."""
    token: str | None = None
    """Bearer token, if the reward service requires one."""
    scorer: str = "searchr1_em"
    """Scorer name the reward service applies."""
    item_format: Literal["solution_str", "prompt_response"] = "solution_str"
    """`solution_str`: Search-R1's decoded prompt+response with `ground_truth.target` (the `searchr1_*`
    scorers); `prompt_response`: separate prompt, response, golden answers and search count."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Scorer parameters passed through (e.g. format-score weights)."""


class TaskSettings(Section):
    max_concurrent: int = Field(default=8, ge=1, le=1024)
    """Tasks (groups) this worker rolls out at once; trajectories of all of them share the engine."""
    block_ms: int = Field(default=500, ge=1)
    """How long one read of the tasks stream blocks (under half the Redis reply timeout of 30 s)."""

    @field_validator("block_ms")
    @classmethod
    def _block_below_reply_timeout(cls, v: int) -> int:
        return check_block_ms("tasks.block_ms", v)
    visibility_timeout_ms: int = Field(default=30_000, ge=1)
    """A task idle this long is reclaimed by another worker (a killed worker's task is redone). Live
    workers reset the idle time of the tasks they hold every quarter of it (a heartbeat), so a slow
    task is never taken from a live worker and a dead one's tasks are redone within about this long."""
    max_deliveries: int = Field(default=3, ge=1)
    """After this many deliveries without ack a task goes to the dead stream. Every delivery counts: the
    first read, another worker's reclaim, and each re-read by a worker restarted under its name."""
    reclaim_interval_s: float = Field(default=5.0, gt=0)
    """How often idle tasks are looked for."""
    drain_timeout_s: float | None = Field(default=8.0, ge=0)
    """On SIGTERM, how long the tasks in flight may take to finish, publish and ack; those still running
    then are cancelled and left unacked (redelivered to another worker after the visibility timeout).
    Keep it below the supervisor's grace period (`[launcher] grace_period_s`, 10 s by default;
    Kubernetes' terminationGracePeriodSeconds), or the worker is killed mid-drain. None: no limit."""
    stall_timeout_s: float = Field(default=900.0, gt=0, le=86_400)
    """`/healthz` turns 503 (and the supervisor restarts the worker) when the worker's loop made no
    progress for this long while Redis answered: a stuck engine call that a drain waits on, a blocked event
    loop. Keep it above the longest weight load plus drain."""
    trim_acked_every: int = Field(default=64, ge=0, le=1_000_000)
    """Every this many acks (tasks stream) or publishes (trajectories stream), the worker deletes the
    entries every consumer group has acked (never a pending or unread one), so Redis memory stays
    bounded over a run of days. 0 keeps every entry: the delivery audit (`searchr1 audit`) reads the
    whole history of both streams, so a run to be audited sets 0."""


class EvalSettings(Section):
    """`searchr1 eval` reports (the rollout service itself does not read this table)."""

    group_by: list[str] = Field(default_factory=lambda: ["data_source"], min_length=1, max_length=16)
    """Keys the eval report breaks metrics down by: `data_source` or any key of a question's
    `metadata`/`extra_info` (a key no question has is left out of the report)."""
    max_failure_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of trajectories with a failed search (retriever unreachable, query refused) or no score
    (reward service failed) above which `searchr1 eval` exits 1, after writing its reports and printing the
    table. 0: any failure fails the evaluation."""


class RolloutSettings(ServiceSettings):
    """Everything a rollout worker needs."""

    model_config = SettingsConfigDict(env_prefix="ROLLOUT_")
    section: ClassVar[str] = "rollout"

    model: str = ""
    """Directory of the initial policy (HF `save_pretrained` output with safetensors and tokenizer)."""
    initial_version: int = Field(default=0, ge=0)
    """Policy version of `model` (0 = the base model)."""
    worker_id: str | None = None
    """Consumer name in the tasks group (None: host-pid)."""
    redis: RedisSettings = Field(default_factory=RedisSettings)
    """Redis connection and run name."""
    engine: EngineSettings = Field(default_factory=EngineSettings)
    """Generation engine."""
    agent: AgentSettings = Field(default_factory=AgentSettings)
    """Agent loop limits and sampling defaults."""
    retriever: RetrieverClientSettings = Field(default_factory=RetrieverClientSettings)
    """Retriever client and search batching."""
    reward: RewardClientSettings = Field(default_factory=RewardClientSettings)
    """Reward client and scorer."""
    tasks: TaskSettings = Field(default_factory=TaskSettings)
    """Task stream consumption."""
    weights: LoadSettings = Field(default_factory=LoadSettings)
    """Weight sync."""
    eval: EvalSettings = Field(default_factory=EvalSettings)
    """`searchr1 eval` reports."""
    metrics_host: str = "127.0.0.1"
    """Host the /metrics endpoint binds."""
    metrics_port: int = Field(default=9403, ge=0, le=65535)
    """Port of the /metrics endpoint (0: any free port); it also answers the probes `/healthz` and
    `/readyz` (503 while Redis is unavailable)."""
    token: str | None = None
    """Bearer token /metrics requires when `metrics_open` is False (the probes stay open); the worker
    serves nothing else. The tokens it sends to other services are `retriever.token`, `reward.token` and
    `weights.token`."""
    metrics_open: bool = True
    """False: /metrics answers only requests carrying `token` (401 otherwise); needs `token`."""

    @model_validator(mode="after")
    def _context_fits_the_model(self) -> RolloutSettings:
        """`engine.max_model_len` left at its default is capped at the context the model declares
        (`max_position_embeddings`), so a model with a shorter one starts without a setting; a value set
        explicitly is kept (vLLM refuses one longer than the model's, naming both)."""
        if "max_model_len" not in self.engine.model_fields_set and self.model:
            limit = model_context_length(self.model)
            if limit is not None and limit < self.engine.max_model_len:
                self.engine = self.engine.model_copy(update={"max_model_len": max(limit, 64)})
        return self

    @model_validator(mode="after")
    def _closed_metrics_need_a_token(self) -> RolloutSettings:
        if not self.metrics_open and not self.token:
            raise ValueError("metrics_open = false needs a token (rollout.token)")
        return self
