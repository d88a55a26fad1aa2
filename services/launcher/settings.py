"""Settings of the local launcher (`searchr1 up`): table `[launcher]` of the run config, env prefix
`LAUNCHER_` (nested with `__`, e.g. `LAUNCHER_ROLLOUT__WORKERS=2`).

What it owns: which processes run, on which loopback ports (0 = pick a free one), where the run
directory and logs go, the health-gate and shutdown timings, the command templates, and where the
status line finds its numbers. What it does not own: each service's own settings — those live in the
service's table of the same run config (`[retriever]`, `[reward]`, `[rollout]`, `[learner]`), which the
launcher hands to every process unchanged with `--config`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from searchr1.core.settings import Section, ServiceSettings

RestartPolicy = Literal["on-failure", "never"]


class RestartSettings(Section):
    """What the launcher does when a long-running process dies after the run is up (Kubernetes' pod
    `restartPolicy` with its crash-loop back-off, for one machine). A process that dies while the run is
    still starting ends the launch: that is a configuration error, not a crash to ride out."""

    policy: RestartPolicy = "on-failure"
    """Default for every process: `on-failure` restarts a process that exits non-zero or dies of a signal
    (the learner's exit 0 still ends the run); `never` ends the run at the first death (each process may
    override it with its own `restart`)."""
    max_restarts: int = Field(default=5, ge=0, le=1000)
    """Restarts of one process allowed within `window_s`; one more death ends the run."""
    window_s: float = Field(default=600.0, gt=0, le=86400)
    """The sliding window `max_restarts` counts in."""
    backoff_initial_s: float = Field(default=1.0, ge=0, le=600)
    """Wait before the first restart of a process; doubled for each further restart within the window."""
    backoff_max_s: float = Field(default=30.0, ge=0, le=3600)
    """Upper bound of the exponential wait."""
    jitter_s: float = Field(default=0.5, ge=0, le=600)
    """Uniform random wait added to each back-off (processes crashed together do not restart in lockstep)."""

    @model_validator(mode="after")
    def _bounds(self) -> RestartSettings:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"backoff_max_s ({self.backoff_max_s}) < backoff_initial_s ({self.backoff_initial_s})")
        return self


class RedisProcessSettings(Section):
    url: str | None = None
    """External Redis URL. When set, no Redis server is started and this one is used."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port of the Redis server the launcher starts (0 = a free one)."""
    health_timeout_s: float = Field(default=20.0, gt=0, le=3600)
    """How long Redis may take to answer PING before the launch is abandoned."""
    appendfsync: Literal["always", "everysec"] = "always"
    """The started Redis keeps an append-only file (AOF) in `RUN_DIR/redis` and is restarted on the same
    port and directory after a crash. `always` fsyncs every write before answering it, so an XADD or XACK
    a service saw succeed survives a `kill -9` of Redis; `everysec` is faster but loses up to about one
    second of them (a task published twice, an ack forgotten: redelivered, then skipped as a replay)."""
    restart: RestartPolicy | None = None
    """This process's restart policy (None = `[launcher.restart] policy`)."""


class ProcessSettings(Section):
    """What every launched service process has: extra environment and extra command-line arguments."""

    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables of the process (values may use the template placeholders); merged
    over the built-in ones (`searchr1.launcher.specs.DEFAULT_ENV`)."""
    extra_args: list[str] = Field(default_factory=list)
    """Extra arguments appended to the process's command line (to every worker's, for the rollout)."""
    restart: RestartPolicy | None = None
    """This process's restart policy (None = `[launcher.restart] policy`)."""


class RetrieverProcessSettings(ProcessSettings):
    index_dir: str | None = None
    """Index directory (relative to the working directory; unset = `RUN_DIR/index`). Built with
    `searchr1 index build` from `corpus` when missing."""
    corpus: str | None = None
    """Corpus JSONL to build the index from when `index_dir` is missing (relative to the working directory)."""
    kind: str = Field(default="bm25", pattern=r"^[a-z0-9_-]+$")
    """Index kind passed to `searchr1 index build --kind`."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC port (0 = a free one)."""
    http_port: int = Field(default=0, ge=0, le=65535)
    """HTTP port of the Search-R1-compatible `/retrieve` endpoint (0 = a free one)."""
    health_timeout_s: float = Field(default=120.0, gt=0, le=7200)
    """How long the retriever may take to report SERVING (gRPC) and 200 on `/healthz` (HTTP)."""
    build_timeout_s: float = Field(default=1800.0, gt=0, le=86400)
    """How long building a missing index may take."""


class RewardProcessSettings(ProcessSettings):
    port: int = Field(default=0, ge=0, le=65535)
    """HTTP port of the reward service (0 = a free one)."""
    health_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """How long the reward service may take to answer 200 on `/healthz`."""


class RolloutProcessSettings(ProcessSettings):
    workers: int = Field(default=1, ge=0, le=64)
    """Number of rollout worker processes (ids `rollout-0` … `rollout-{N-1}`)."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """First metrics port; worker i uses `metrics_port + i` (0 = a free one each)."""
    health_timeout_s: float = Field(default=600.0, gt=0, le=7200)
    """How long a worker may take (vLLM start-up included) to answer 200 on `/metrics`."""


class LearnerProcessSettings(ProcessSettings):
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus port of the learner (0 = a free one)."""
    health_timeout_s: float = Field(default=600.0, gt=0, le=7200)
    """How long the learner may take to answer 200 on `/metrics`."""
    metrics_jsonl: str = "{run_dir}/learner/{run}.jsonl"
    """The learner's JSONL step log, read by the status line; `{run}` and `{run_dir}` are substituted, a
    relative path is relative to the working directory. The default is where the learner writes it given
    the launcher's default `LEARNER_LOG_DIR={run_dir}/learner` (the learner writes `log_dir/{run}.jsonl`).
    A missing or unreadable file only blanks those numbers."""


class StatusSettings(Section):
    refresh_s: float = Field(default=1.0, gt=0, le=600)
    """How often the status numbers are collected (and the live line redrawn on a terminal)."""
    plain_interval_s: float = Field(default=15.0, gt=0, le=3600)
    """When output is not a terminal, print the status as a plain line this often (when the run's step
    total is unknown or `plain_every_percent` is 0)."""
    plain_every_percent: float = Field(default=5.0, ge=0, le=100)
    """When output is not a terminal and the step total is known, print the status line each time training
    advances by this share of the total (5: about 20 lines per run, however long it takes)."""
    jsonl_keys: dict[str, list[str]] = Field(default_factory=lambda: {
        "step": ["step", "global_step"],
        "reward_mean": ["reward_mean", "reward/mean", "critic/score/mean", "reward"],
        "em": ["em_mean", "em", "reward/em", "em/mean"],
        "searches_per_question": ["searches_per_question", "searches_per_trajectory", "num_searches_mean",
                                  "searches/mean", "searches"],
    })
    """For each status field, the JSONL keys that may hold it (first present wins)."""
    prometheus_names: dict[str, list[str]] = Field(default_factory=lambda: {
        "step": ["searchr1_learner_steps_total", "searchr1_learner_step"],
        "reward_mean": ["searchr1_learner_reward_mean"],
        "em": ["searchr1_learner_em_mean", "searchr1_learner_em"],
        "searches_per_question": ["searchr1_learner_searches_per_trajectory",
                                  "searchr1_learner_searches_per_question"],
    })
    """For each status field, the learner's Prometheus sample names that may hold it (first wins);
    used when the JSONL log lacks the field."""


class ValidationSettings(Section):
    """Validation during training (Search-R1's `trainer.test_freq` and `trainer.val_before_train`): the
    launcher evaluates the learner's snapshots on a held-out set with `searchr1 eval` against the run's live
    retriever and reward service (greedy; the run config's rollout table gives engine and limits), one at a
    time beside the training, and records the curve (`searchr1.launcher.validation`)."""

    eval_every: int = Field(default=0, ge=0, le=1_000_000)
    """Validate every policy version that is a multiple of this (the learner publishes version N after step
    N); 0: never during training."""
    eval_before_train: bool = False
    """Validate the initial policy (`[rollout] model`) too, recorded as step 0."""
    eval_after_train: bool = True
    """With `eval_every` > 0: when the learner ends, validate its last version too if it was not."""
    data: str | None = None
    """Held-out questions (Search-R1 parquet or tasks JSONL), relative to the working directory; needed when
    validation is on."""
    limit: int | None = Field(default=None, ge=1)
    """Validate on the first N questions only."""
    samples: int = Field(default=0, ge=0, le=64)
    """Sampled trajectories per question besides the greedy one (the curve is the greedy score)."""
    args: list[str] = Field(default_factory=list)
    """Extra arguments for `searchr1 eval` (e.g. ["--concurrency", "32"])."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of the validation process over the rollout workers' (its engine's settings): with a
    `[placement]`, the GPU it evaluates on, e.g. {CUDA_VISIBLE_DEVICES = "7",
    ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION = "0.3"}."""
    base_model: str | None = None
    """Where the tokenizer and chat template of the snapshots come from, and the model of step 0 (default:
    `[rollout] model` of the run config)."""
    metrics_port: int | None = Field(default=0, ge=0, le=65535)
    """Port of the launcher's Prometheus endpoint with the validation gauges (`searchr1_validation_*`; 0: a
    free one, named in RUN_DIR/connection.json; None: not served)."""
    tensorboard_dir: str | None = None
    """Also write the curve as TensorBoard scalars here (`{run_dir}` is substituted; extra `tensorboard`)."""
    wandb_project: str | None = None
    """Also log the curve to this Weights & Biases project (a run named `<run>-validation`; extra `wandb`)."""
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    """W&B mode for that run (None: W&B's default, WANDB_MODE)."""
    timeout_s: float = Field(default=7200.0, gt=0, le=604_800)
    """How long one validation may take before it is stopped (and recorded as failed)."""
    drain_timeout_s: float = Field(default=3600.0, ge=0, le=604_800)
    """When the learner ends, how long the launcher waits for validations still queued or running before it
    stops the services (they need the retriever and reward)."""
    poll_interval_s: float = Field(default=2.0, gt=0, le=600)
    """How often the learner's snapshot directory is looked at for new versions."""

    @property
    def enabled(self) -> bool:
        return self.eval_every > 0 or self.eval_before_train

    @model_validator(mode="after")
    def _needs_data(self) -> ValidationSettings:
        if self.enabled and not self.data:
            raise ValueError("validation is on (eval_every or eval_before_train) but [launcher.validation] data "
                             "names no held-out set")
        return self


class DemoSettings(Section):
    """`searchr1 demo`: the tiny world end to end (world → warm start → eval → GRPO via `up` → eval →
    report). Paths are relative to the working directory."""

    world_dir: str = "runs/world"
    """World directory (`searchr1 world build` output); built when its manifest is missing."""
    seed: int = Field(default=0, ge=0)
    """World seed (`world build --seed`)."""
    warmstart_dir: str = "runs/world/warmstart"
    """Warm-start checkpoint the run starts from (the rollout and learner tables must name the same
    directory); trained with `searchr1 world warmstart` when it has no weights."""
    warmstart_args: list[str] = Field(default_factory=list)
    """Extra arguments for `searchr1 world warmstart` (e.g. ["--steps", "1200"])."""
    eval_data: str = "runs/world/test.parquet"
    """Held-out questions evaluated before and after training (Search-R1 parquet)."""
    eval_args: list[str] = Field(default_factory=lambda: ["--samples", "4"])
    """Extra arguments for `searchr1 eval` (greedy + sampled trajectories per question, limit, …)."""
    weights_dir: str | None = None
    """Where the learner writes its snapshots; default: RUN_DIR/weights, where `searchr1 up` puts them."""


class LauncherSettings(ServiceSettings):
    """Settings of `searchr1 up`."""

    model_config = ServiceSettings.model_config | {"env_prefix": "LAUNCHER_"}
    section: ClassVar[str] = "launcher"

    run: str = Field(default="default", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """Run name (Redis keys `searchr1:{run}:…`), passed to rollout workers and the learner."""
    run_dir: str = "runs/default"
    """Run directory (relative to the working directory): logs go to `RUN_DIR/logs/<name>.log`."""
    host: str = "127.0.0.1"
    """Interface every process binds to. Loopback: the launcher is for one machine."""
    command: list[str] = Field(default_factory=list)
    """How to invoke the `searchr1` CLI; empty = this interpreter with `-m searchr1.cli`."""
    commands: dict[str, list[str]] = Field(default_factory=dict)
    """Per-process override of `command` (keys as in `templates`), e.g. the learner under torchrun."""
    templates: dict[str, list[str]] = Field(default_factory=dict)
    """Per-process argument templates overriding the built-in ones (keys `index-build`, `retriever`,
    `reward`, `rollout`, `learner`; see `searchr1.launcher.specs.DEFAULT_TEMPLATES`)."""
    grace_period_s: float = Field(default=10.0, gt=0, le=7200)
    """After SIGTERM, how long a process may take to exit before it is killed. A learner on GPUs needs a
    whole step and its checkpoint (`searchr1.learner.stop_budget`; the Search-R1 configs set it so); its
    torchrun gets this less 10 s (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`)."""
    log_tail_lines: int = Field(default=20, ge=0, le=1000)
    """Lines of a failed process's log shown in the failure message."""
    die_with_launcher: bool = True
    """Ask the kernel to SIGTERM each child if the launcher itself dies (Linux PR_SET_PDEATHSIG)."""
    redis: RedisProcessSettings = Field(default_factory=RedisProcessSettings)
    """The Redis server (started by the launcher unless `url` is set)."""
    retriever: RetrieverProcessSettings = Field(default_factory=RetrieverProcessSettings)
    """The retriever process (and its index build)."""
    reward: RewardProcessSettings = Field(default_factory=RewardProcessSettings)
    """The reward service process."""
    rollout: RolloutProcessSettings = Field(default_factory=RolloutProcessSettings)
    """The rollout worker processes."""
    learner: LearnerProcessSettings = Field(default_factory=LearnerProcessSettings)
    """The learner process; its exit ends the run."""
    restart: RestartSettings = Field(default_factory=RestartSettings)
    """Restart of crashed processes (policy, budget, back-off)."""
    status: StatusSettings = Field(default_factory=StatusSettings)
    """Where the status line finds its numbers."""
    demo: DemoSettings = Field(default_factory=DemoSettings)
    """`searchr1 demo`'s paths and steps."""
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    """Validation during training: held-out evaluations of the learner's snapshots (off by default)."""
