"""Learner settings: `LearnerSettings` (env prefix `LEARNER_`, run-config table `[learner]`, nested
sections through `__`, e.g. `LEARNER_OPTIM__LR=1e-6`). The sections of what the learner writes
(checkpoints, the trajectory archive) are in `settings_outputs`, re-exported here; its weight publishing
section is weight sync's (`searchr1.weightsync.PublishSettings`).

Defaults follow Search-R1's `train_grpo.sh` / `ppo_trainer.yaml` where a value exists there (lr 1e-6,
clip 0.2, entropy 0.001, KL loss 0.001 low_var_kl, grad clip 1.0, γ = λ = 1, value clip 0.5, critic lr 1e-5).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from searchr1.core.settings import AuthSettings, RedisSettings, Section, ServiceSettings, check_block_ms
from searchr1.learner.algo.temperature import TRAINING_TEMPERATURE, check_rollout_temperature
from searchr1.learner.guard import GuardSettings
from searchr1.learner.settings_outputs import ArchiveSettings as ArchiveSettings
from searchr1.learner.settings_outputs import CheckpointSettings as CheckpointSettings
from searchr1.weightsync import PublishSettings


class LoraSettings(Section):
    enabled: bool = False
    """Train a LoRA adapter instead of every weight (snapshots carry merged full weights)."""
    r: int = Field(default=16, ge=1, le=1024)
    """LoRA rank."""
    alpha: int = Field(default=32, ge=1)
    """LoRA alpha (scale = alpha / r)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the LoRA branch."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names that get adapters."""


class ModelSettings(Section):
    path: str = Field(min_length=1, default="model")
    """Local directory (or hub name, when the hub is reachable) of the HF causal LM to train."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Training precision (`train/precision.py`): the forward and backward's dtype over fp32 master weights
    and optimizer state. float32; bfloat16 (bf16 compute through FSDP2's mixed-precision policy, on one rank
    too); float16 (the same in fp16, with dynamic loss scaling: pair it with an fp16 engine); auto =
    bfloat16 on GPU, float32 on CPU."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (saves memory, costs ~30% time)."""
    lora: LoraSettings = Field(default_factory=LoraSettings)
    """Optional LoRA."""
    critic_path: str | None = None
    """Critic (PPO) initialisation; None = the policy's path (as Search-R1 does)."""


class AlgorithmSettings(Section):
    advantage: Literal["grpo", "dr_grpo", "gae"] = "grpo"
    """Advantage estimator: GRPO (group-normalised outcome), Dr. GRPO (no std scaling) or PPO's GAE."""
    policy_loss: Literal["ppo_clip"] = "ppo_clip"
    """Policy-loss variant (registry `losses.POLICY_LOSSES`)."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    """How per-token losses are reduced (normalised over the whole step, not per micro-batch)."""
    clip_low: float = Field(default=0.2, gt=0.0, lt=1.0)
    """PPO clip ε (lower side)."""
    clip_high: float | None = Field(default=None, gt=0.0, lt=10.0)
    """Upper clip ε; None = clip_low; larger = DAPO clip-higher."""
    entropy_coef: float = Field(default=0.001, ge=-1.0, le=1.0)
    """Entropy bonus coefficient (Search-R1 default 0.001); negative = entropy minimisation (a sharper policy)."""
    use_kl_loss: bool = True
    """Add `kl_loss_coef × KL(π‖π_ref)` to the actor's loss, for GRPO and PPO alike as in veRL's actor (needs a
    reference model). PPO configs that take Search-R1's in-reward KL instead set it false."""
    kl_loss_coef: float = Field(default=0.001, ge=0.0)
    """Weight of the KL loss."""
    kl_loss_type: Literal[
        "kl", "abs", "mse", "low_var_kl", "k1", "k2", "k3", "k3plusplus", "k4", "k5", "full_reverse", "full_forward"
    ] = "low_var_kl"
    """KL estimator for the loss: a sampled one (`losses.KL_ESTIMATORS`; k1/k2/k3 name kl/mse/low_var_kl;
    k3plusplus/k4/k5 are EMA-PG's, same values, other gradients), or EMA-PG's `full_reverse`
    (KL(π‖π_ref)) / `full_forward` (KL(π_ref‖π)) summed over the vocabulary or its top `kl_topk_tokens`."""
    kl_in_reward: bool = False
    """PPO: subtract `kl_coef × KL` from the token rewards (Search-R1's PPO)."""
    kl_coef: float = Field(default=0.001, ge=0.0)
    """In-reward KL coefficient (fixed controller)."""
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl"] = "kl"
    """KL estimator for the in-reward penalty."""
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """GAE discount."""
    lam: float = Field(default=1.0, ge=0.0, le=1.0)
    """GAE λ."""
    grpo_eps: float = Field(default=1e-6, gt=0.0)
    """ε added to the group std."""
    value_clip: float = Field(default=0.5, gt=0.0)
    """Critic clip range."""
    max_staleness: int = Field(default=0, ge=0)
    """Drop groups generated more than this many versions ago; 0 = fully on-policy."""
    is_cap: float = Field(default=2.0, ge=1.0)
    """Truncation of the importance weights of off-policy groups."""
    tis_cap: float | None = Field(default=None, ge=1.0, le=100.0)
    """Truncated importance sampling against the train–inference mismatch (veRL's `tis_imp_ratio_cap`):
    on-policy tokens' advantages × min(π_learner / π_engine, tis_cap) (`algo/tis.py`); None = off. veRL: 2."""
    mismatch_correction: Literal["tis", "seq_mask", "icepop"] = "tis"
    """Correction of the on-policy rows for the train–inference mismatch (`algo/mismatch.py`): `tis`
    (truncation by `tis_cap`; none when it is unset), `seq_mask` (sequences whose geometric-mean ratio
    leaves `seq_mask_band` get no policy gradient; kept ones get TIS when `tis_cap` is set) or `icepop`
    (tokens whose ratio leaves `icepop_band` get none). docs/learner.md says when to use which."""
    seq_mask_band: tuple[float, float] = (0.999, 1.001)
    """`seq_mask`: the geometric-mean ratios π_learner/π_engine kept, [lo, hi] with 0 < lo ≤ 1 ≤ hi."""
    icepop_band: tuple[float, float] = (0.5, 5.0)
    """`icepop`: the token ratios kept, [α, β] with 0 < α ≤ 1 ≤ β."""
    ref_ema_tau: float = Field(default=1.0, gt=0.0, le=1.0)
    """EMA anchor (EMA-PG's `ref_policy_ema_tau`): every `ref_ema_period` steps, after the optimizer step,
    θ_ref ← τ·θ_ref + (1 − τ)·θ. 1 = a frozen reference (off); EMA-PG uses 0.9. Saved in checkpoints
    when < 1. Needs full fine-tuning (not LoRA)."""
    ref_ema_period: int = Field(default=10, ge=1)
    """Steps between EMA updates of the reference (EMA-PG's `ref_policy_ema_update_period`)."""
    kl_topk_tokens: int = Field(default=0, ge=0, le=65536)
    """`full_reverse` / `full_forward`: sum the KL over the k most likely tokens per position (the
    pre-update policy's for reverse, the reference's for forward); 0 = the whole vocabulary. EMA-PG: 32."""
    kl_tail_sampling: bool = True
    """Top-k KL: add a sampled estimate of the mass outside the top k, from the sampled token when it falls
    outside them (k4 for reverse, k5 for forward); EMA-PG's `kl_use_tail_sampling`."""
    kl_importance_weight: bool = False
    """Multiply the KL's sampled part (the whole term of a sampled estimator, the tail of a top-k one) by
    π/π_old, for tokens sampled from π_old (EMA-PG's `use_kl_iw`; matters from the second mini-batch)."""
    kl_iw_clip: tuple[float, float] | None = None
    """Clip the KL importance weight to [lo, hi] (0 ≤ lo ≤ hi); None = unclipped (exp of a log-ratio
    clamped to ±20)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal (zero GRPO advantage) and keep reading
    until the step has `groups_per_step` informative groups."""
    dynamic_sampling_max_batches: int = Field(default=10, ge=1, le=1000)
    """Dynamic sampling gives up (a clear error) after reading this many step-sized batches of groups
    without filling one step (DAPO's `max_num_gen_batches`)."""
    overlong_filter: bool = False
    """DAPO overlong filtering: responses cut by the length limit (finish reason "length") get loss mask 0."""

    @field_validator("seq_mask_band", "icepop_band")
    @classmethod
    def _ratio_band(cls, band: tuple[float, float], info) -> tuple[float, float]:
        lo, hi = band
        if not (0.0 < lo <= 1.0 <= hi):
            raise ValueError(f"algorithm.{info.field_name} must satisfy 0 < lo <= 1 <= hi, got [{lo}, {hi}]")
        return band

    @property
    def kl_loss_on(self) -> bool:
        """Whether the actor's loss has a KL term (derived): `use_kl_loss` with `kl_loss_coef > 0`. A zero
        coefficient runs no reference forward and loads no reference for it."""
        return self.use_kl_loss and self.kl_loss_coef > 0


class OptimSettings(Section):
    lr: float = Field(default=1e-6, gt=0.0)
    """Policy learning rate."""
    critic_lr: float = Field(default=1e-5, gt=0.0)
    """Critic learning rate (PPO)."""
    weight_decay: float = Field(default=0.01, ge=0.0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """Linear warm-up over this share of `total_steps` (Search-R1: 0.285 GRPO, 0.95 PPO actor)."""
    critic_warmup_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """Critic warm-up share (Search-R1 PPO: 0.05)."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """After the warm-up: "constant" (veRL's and Search-R1's default), or "cosine" / "linear" decay to
    `min_lr_ratio` × lr at `total_steps` (veRL's cosine; TRL/HF lr_scheduler_type)."""
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """Floor of a decaying schedule, as a fraction of the peak rate (veRL's min_lr_ratio)."""
    total_steps: int = Field(default=1000, ge=1)
    """Planned training steps: the schedule's length (warm-up share, decay) and when training stops."""
    grad_clip: float = Field(default=1.0, gt=0.0)
    """Clip the global gradient norm to this."""


class BatchSettings(Section):
    groups_per_step: int = Field(default=8, ge=1)
    """Groups consumed per training step (Search-R1: 512 prompts × 5)."""
    mini_batches: int = Field(default=1, ge=1)
    """Optimizer updates per step (Search-R1: train_batch 512 / mini-batch 256 = 2)."""
    micro_batch_size: int = Field(default=8, ge=1)
    """Trajectories per forward/backward (gradient accumulation inside a mini-batch)."""
    max_seq_len: int = Field(default=8192, ge=8)
    """Sequences longer than this are truncated from the end (the cut tokens get no loss)."""


class DispatcherSettings(Section):
    enabled: bool = True
    """Feed the tasks stream from `dataset`."""
    dataset: str | None = None
    """Search-R1 parquet or our JSONL of tasks."""
    group_size: int = Field(default=5, ge=1, le=1024)
    """G trajectories per task (Search-R1: n_agent = 5)."""
    max_inflight: int = Field(default=64, ge=1)
    """Tasks kept queued or in progress ahead of the learner."""
    seed: int = 0
    """Shuffle seed (epoch e uses seed + e)."""
    epochs: int = Field(default=15, ge=1)
    """Passes over the dataset."""
    source_repeats: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)
    """Data mix: `{data_source: k}` puts each question of that source k times in every epoch (k ≥ 1;
    sources not named count once; a name the dataset lacks is an error)."""
    temperature: float = Field(default=TRAINING_TEMPERATURE, ge=0.0, le=10.0)
    """Sampling temperature written into each task: must be the learner's training temperature, 1
    (`learner/algo/temperature.py`); any other value is refused at start."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    """Nucleus mass written into each task; None = each worker's `agent.top_p`."""
    poll_s: float = Field(default=0.2, gt=0.0)
    """Seconds between backpressure checks."""
    paced: bool = True
    """Publish at most `(max_staleness + 1) × groups_per_step` tasks ahead of the learner's updates (see
    `algo/staleness.py`); False = only `max_inflight` bounds the stream."""

    @field_validator("temperature")
    @classmethod
    def _training_temperature(cls, value: float) -> float:
        return check_rollout_temperature(value, "dispatcher.temperature")


class DesyncSettings(Section):
    """Per-worker desync detection (`algo/desync.py`): before each step, the learner scores the step's groups
    and sets aside every group of a worker whose mismatch is far beyond its peers', telling it to re-sync."""

    enabled: bool = False
    """Run the screen (one no-grad forward over the step's rows, about a third of a step's compute)."""
    abs_threshold: float = Field(default=0.005, gt=0.0, le=10.0)
    """Mean |log π_learner − log π_engine| per sampled token below which no worker is flagged (fp32 pairs
    sit near 1e-5, a reload skipped at lr 2e-6 near 0.014, bf16 engines near 0.04: docs/learner.md,
    "Train–inference mismatch")."""
    ratio: float = Field(default=5.0, ge=1.0, le=1e6)
    """A worker is flagged when its mean exceeds this many times the median of its peers' (or the
    threshold, when it is the step's only worker)."""
    min_tokens: int = Field(default=64, ge=1)
    """Workers with fewer sampled tokens in a step are not judged (too little evidence)."""


class LearnerSettings(ServiceSettings):
    """Settings of the learner service (`searchr1 train`)."""

    model_config = SettingsConfigDict(env_prefix="LEARNER_")
    section = "learner"

    redis: RedisSettings = Field(default_factory=RedisSettings)
    """Redis with the run's streams."""
    model: ModelSettings = Field(default_factory=ModelSettings)
    """Policy (and critic) model."""
    algorithm: AlgorithmSettings = Field(default_factory=AlgorithmSettings)
    """GRPO / PPO hyper-parameters."""
    optim: OptimSettings = Field(default_factory=OptimSettings)
    """Optimizer and schedule."""
    batch: BatchSettings = Field(default_factory=BatchSettings)
    """Step / mini-batch / micro-batch sizes."""
    dispatcher: DispatcherSettings = Field(default_factory=DispatcherSettings)
    """Task feeding."""
    weights: PublishSettings = Field(default_factory=PublishSettings)
    """Weight publishing."""
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    """Checkpoints."""
    archive: ArchiveSettings = Field(default_factory=ArchiveSettings)
    """Trajectory archive (and replay from one)."""
    guard: GuardSettings = Field(default_factory=GuardSettings)
    """The guarded response to a collapse: roll back, cut the learning rate, stop after a bound (off by default)."""
    desync: DesyncSettings = Field(default_factory=DesyncSettings)
    """Per-worker desync detection and its guard action: set aside, re-sync (off by default)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Training device."""
    seed: int = 0
    """Torch seed."""
    threads: int = Field(default=0, ge=0)
    """torch intra-op threads on CPU (0 = torch's default)."""
    openmp_waits: Literal["auto", "passive", "spin"] = "auto"
    """How idle torch (OpenMP) threads wait on CPU: `passive` sleeps at once, `spin` keeps libgomp's default
    (spin, then sleep), `auto` = passive when `algorithm.max_staleness > 0` (training overlaps generation,
    so on one machine the learner's cores are shared), spin otherwise. `OMP_WAIT_POLICY` in the
    environment wins. Sharing a core with a busy process, two spinning threads took 1.6–1.9x as long per
    tiny-world step as passive ones (`searchr1.core.openmp`; docs/performance.md, "System")."""

    def openmp_wait_policy(self) -> Literal["passive", "spin"]:
        """`openmp_waits` with `auto` resolved."""
        if self.openmp_waits != "auto":
            return self.openmp_waits
        return "passive" if self.algorithm.max_staleness > 0 else "spin"
    log_dir: Path = Path("logs")
    """JSONL step log goes to `log_dir/{run}.jsonl`."""
    metrics_host: str = Field(default="127.0.0.1", min_length=1)
    """Host the /metrics endpoint binds (loopback unless told otherwise; 0.0.0.0 in a container)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Prometheus /metrics port (None = not served); it also answers the probes `/healthz` and `/readyz`
    (503 while Redis is unavailable)."""
    token: str | None = None
    """Bearer token /metrics requires when `metrics_open` is False (the probes stay open). The snapshot
    server has its own, `weights.token`."""
    metrics_open: bool = True
    """False: /metrics answers only requests carrying `token` (401 otherwise); needs `token`."""
    auth: AuthSettings = Field(default_factory=AuthSettings)
    """With `weights.http`, an empty `weights.token` refuses to start unless `auth.insecure_no_auth` is on."""
    consumer: str = Field(default="learner-0", min_length=1)
    """Consumer name in the trajectories group."""
    visibility_timeout_ms: int = Field(default=600_000, ge=1)
    """Unacked groups idle longer than this are re-read (after a crash)."""
    max_deliveries: int = Field(default=5, ge=1)
    """Groups delivered this often without ack are dead-lettered. Every delivery counts: the first read, a
    reclaim, and each re-read by a restarted learner (a group that crashes the learner is buried after
    this many restarts before its checkpoint)."""
    read_block_ms: int = Field(default=1000, ge=1)
    """How long one stream read blocks (under half the Redis reply timeout of 30 s)."""

    @field_validator("read_block_ms")
    @classmethod
    def _block_below_reply_timeout(cls, v: int) -> int:
        return check_block_ms("read_block_ms", v)
    lease_ttl_ms: int = Field(default=30_000, ge=1_000, le=600_000)
    """The learner's lease on its run (one learner per run, `searchr1.streams.Lease`): renewed every third of this;
    a second learner refuses to start while it is held, and a crashed learner's lease expires after it."""
    stall_timeout_s: float = Field(default=1800.0, gt=0, le=86_400)
    """Liveness that means progress (core/watchdog.py): once the learner made no progress (its start done,
    a step trained, bytes of a checkpoint written) for this long — a hung collective, a checkpoint on a
    volume that stopped writing, a step whose groups never come — `/healthz` answers 503, rank 0 stops
    renewing its lease and the process exits 1 naming what it waited for, so it is restarted and another
    learner may take the run over. Waiting for groups is no progress; waiting for Redis is not a stall. It
    must exceed the start (a model load) and the longest step without a checkpoint."""
    wandb_project: str | None = None
    """Also log every step's figures to this Weights & Biases project (extra `wandb`; the run is named after
    `redis.run`, its files under `log_dir`)."""
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    """W&B mode (None: W&B's own default, WANDB_MODE); `offline` keeps the run on disk for `wandb sync`."""
    tensorboard_dir: Path | None = None
    """Also write every step's figures as TensorBoard scalars under this directory (extra `tensorboard`)."""

    @property
    def archive_dir(self) -> Path:
        """Where the trajectory archive goes: `archive.dir`, or `archive/` beside the checkpoints."""
        return self.archive.dir if self.archive.dir is not None else self.checkpoint.dir.parent / "archive"

    @model_validator(mode="after")
    def _coherent(self) -> LearnerSettings:
        if not self.metrics_open and not self.token:
            raise ValueError("metrics_open = false needs a token (learner.token)")
        if self.algorithm.advantage == "gae" and self.algorithm.use_kl_loss and self.algorithm.kl_in_reward:
            raise ValueError("choose one KL term for PPO: use_kl_loss (in the actor's loss) or kl_in_reward "
                             "(in the token rewards, Search-R1's PPO)")
        a = self.algorithm
        if a.ref_ema_tau < 1.0:
            if self.model.lora.enabled:
                raise ValueError("ref_ema_tau < 1 (EMA reference) needs full fine-tuning: with LoRA the policy is "
                                 "base weights plus adapters and cannot be averaged into the reference")
            if not (a.kl_loss_on or a.kl_in_reward):
                raise ValueError("ref_ema_tau < 1 needs a KL term (use_kl_loss with kl_loss_coef > 0, or kl_in_reward)")
        if a.kl_iw_clip is not None and not 0.0 <= a.kl_iw_clip[0] <= a.kl_iw_clip[1]:
            raise ValueError(f"kl_iw_clip must be [lo, hi] with 0 <= lo <= hi, got {list(a.kl_iw_clip)}")
        if a.kl_topk_tokens and not a.kl_loss_type.startswith("full_"):
            raise ValueError("kl_topk_tokens applies to kl_loss_type full_reverse / full_forward only")
        if a.dynamic_sampling and a.advantage == "gae":
            raise ValueError("dynamic_sampling drops groups of equal rewards, which carry no signal under "
                             "GRPO; with GAE (PPO) they still train the critic: use it with grpo / dr_grpo")
        return self
