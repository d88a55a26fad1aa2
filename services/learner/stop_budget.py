"""How long the learner needs to stop cleanly: the grace a supervisor must give it between SIGTERM and
SIGKILL (torchrun's `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, a pod's `terminationGracePeriodSeconds`, compose's
`stop_grace_period`, `[launcher] grace_period_s` under `searchr1 up`).

On SIGTERM the learner stops waiting for groups at once (no partial step) but finishes a step it is
training: the step itself, its checkpoint when the step is on the cadence (`checkpoint.every`) and the
weight snapshot it publishes, then exits 143. The worst case is a signal just as a step on the cadence
starts: one whole step, one checkpoint and one snapshot, each bounded from the config's shape
(`stop_budget`):

- the step: `groups_per_step × group_size` trajectories of up to `max_seq_len` tokens, every token costing
  the policy's forward and backward (6 N FLOPs for N parameters), the forward recomputed under gradient
  checkpointing (2 N), the frozen reference's forward with the KL loss on (2 N), the desync screen's
  forward when it is on (2 N) and PPO's critic (its own 6 N or 8 N), spread over the FSDP ranks at
  `ASSUMED_FLOPS` each;
- the checkpoint: fp32 weights and both AdamW moments (`CHECKPOINT_BYTES_PER_PARAM`; the critic's too)
  written at `WRITE_BYTES_PER_S`;
- the snapshot: the weights in 2-byte precision (bf16/fp16; fp32 doubles it) at the same rate;
- `EXIT_S` for the process to close its servers, its Redis link and the collective group.

N is the model's parameter count: from its `config.json` when the model directory exists, else from the
shapes of the models the shipped configs name (`KNOWN_SHAPES`; the GPU configs are generated before the
data step has fetched their model).

The rates are assumptions, not measurements (no GPU here), chosen low so that the grace errs long: a
learner that finishes early exits early, so a long grace only delays the kill of one that hangs, and a
hung learner is restarted by its liveness probe anyway. Pass the step time you measured
(`searchr1_learner_step_seconds`) to replace the estimate.

Departure from Search-R1: veRL has no graceful stop (a killed trainer resumes from its last saved step);
here the steps since the last checkpoint are retrained after a kill, so a grace that covers the step in
hand loses nothing but the wait.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searchr1.learner.settings import LearnerSettings

__all__ = ["StopBudget", "StopBudgetError", "stop_budget", "model_parameters", "dense_decoder_parameters",
           "KNOWN_SHAPES"]

ASSUMED_FLOPS = 100e12
"""Sustained training FLOP/s per GPU (bf16): about a tenth of an H100's dense peak. One H100 ran a
Qwen2.5-3B-shaped forward and backward with recompute at 382 TFLOP/s (8 N per token; 7B's shape 534),
without FSDP's collectives or the optimizer (docs/deploy.md, "Stopping the learner"): the estimate errs
long."""
CPU_FLOPS = 50e9
"""The same for a learner on CPU (the tiny world's: a few cores of fp32)."""
WRITE_BYTES_PER_S = 100e6
"""Checkpoint and snapshot write rate: a network volume's (local NVMe writes 10–30× faster)."""
CHECKPOINT_BYTES_PER_PARAM = 12
"""fp32 weights and both AdamW moments, the most any `model.dtype` checkpoints per parameter."""
EXIT_S = 30.0
"""Closing the servers, the Redis link and the collective group after the last step."""

KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen2.5-3B": {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
                   "tie_word_embeddings": True},
    "Qwen2.5-7B": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False},
}
"""The `config.json` shapes of the models the shipped GPU configs train (`-Instruct` shares its base's)."""


class StopBudgetError(ValueError):
    """The model's size cannot be told; the message says what to pass."""


@dataclass(frozen=True)
class StopBudget:
    """A clean stop's worst case, in seconds."""

    step_s: float
    checkpoint_s: float
    snapshot_s: float
    parameters: int
    tokens: int
    """Tokens one step trains at most."""
    ranks: int
    measured_step: bool = False
    """Whether `step_s` was given (a measured step time) rather than estimated."""

    @property
    def total_s(self) -> int:
        """The grace: step + checkpoint + snapshot + `EXIT_S`, rounded up to whole minutes."""
        return int(math.ceil((self.step_s + self.checkpoint_s + self.snapshot_s + EXIT_S) / 60.0) * 60)

    def explain(self) -> str:
        """One line saying where the grace comes from."""
        step = (f"a step {self.step_s:.0f} s (measured)" if self.measured_step else
                f"a step {self.step_s:.0f} s ({self.tokens:,} tokens × {self.parameters / 1e9:.2f} B parameters "
                f"over {self.ranks} rank(s))")
        return (f"{step} + a checkpoint {self.checkpoint_s:.0f} s + a snapshot {self.snapshot_s:.0f} s + exit "
                f"{EXIT_S:.0f} s = {self.total_s} s")


def dense_decoder_parameters(cfg: dict[str, Any]) -> int:
    """Parameters of a dense decoder-only transformer (Qwen2, Llama, Mistral) from its `config.json`:
    embeddings (and an untied LM head), per layer the attention projections (Qwen2's q/k/v biases), the
    gated MLP and two norms, and the final norm."""
    h, layers, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or h // heads
    q, k = heads * head_dim, kv * head_dim
    attn = h * q + 2 * h * k + q * h
    if cfg.get("attention_bias", cfg.get("model_type") == "qwen2"):
        attn += q + 2 * k
    layer = attn + 3 * h * inter + 2 * h
    embeddings = cfg["vocab_size"] * h * (1 if cfg.get("tie_word_embeddings", False) else 2)
    return embeddings + layers * layer + h


def model_parameters(path: str | Path) -> int:
    """The parameter count of the model at `path`: from its `config.json` when there is one, else from
    `KNOWN_SHAPES` by the directory's name; `StopBudgetError` otherwise."""
    config = Path(path) / "config.json"
    if config.is_file():
        return dense_decoder_parameters(json.loads(config.read_text()))
    name = Path(path).name.removesuffix("-Instruct")
    if name in KNOWN_SHAPES:
        return dense_decoder_parameters(KNOWN_SHAPES[name])
    raise StopBudgetError(f"cannot tell the size of {path} (no config.json there, and not one of "
                          f"{', '.join(sorted(KNOWN_SHAPES))}): pass the measured step time instead")


def stop_budget(settings: LearnerSettings, ranks: int, *, gpu: bool = True, step_s: float | None = None,
                parameters: int | None = None) -> StopBudget:
    """The worst case of a clean stop for the learner `settings` on `ranks` FSDP ranks (GPUs, or CPU
    processes with `gpu=False`); `step_s` replaces the step estimate with a measured step time and
    `parameters` the model's size."""
    n = parameters if parameters is not None else model_parameters(settings.model.path)
    a = settings.algorithm
    per_token = 6 * n
    if settings.model.gradient_checkpointing:
        per_token += 2 * n
    if a.use_kl_loss or a.kl_in_reward:
        per_token += 2 * n
    if settings.desync.enabled:
        per_token += 2 * n
    critic = a.advantage == "gae"
    if critic:  # the critic's forward and backward (and recompute) at the policy's size
        per_token += (8 if settings.model.gradient_checkpointing else 6) * n
    tokens = settings.batch.groups_per_step * settings.dispatcher.group_size * settings.batch.max_seq_len
    estimated = tokens * per_token / (max(1, ranks) * (ASSUMED_FLOPS if gpu else CPU_FLOPS))
    checkpoint_bytes = CHECKPOINT_BYTES_PER_PARAM * n * (2 if critic else 1)
    snapshot_bytes = (4 if settings.model.dtype == "float32" else 2) * n
    return StopBudget(step_s=estimated if step_s is None else step_s,
                      checkpoint_s=checkpoint_bytes / WRITE_BYTES_PER_S, snapshot_s=snapshot_bytes / WRITE_BYTES_PER_S,
                      parameters=n, tokens=tokens, ranks=max(1, ranks), measured_step=step_s is not None)
