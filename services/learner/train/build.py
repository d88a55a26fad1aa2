"""The models and trainer of one learner process: `build_training` loads the policy, and the reference and
critic when the algorithm needs them, with their optimizers, as the settings ask.

Owns which models a run needs; not the training step (`trainer.py`) nor the loading itself (`model.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from searchr1.core.metrics import StageClock
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.checkpoint import Component
from searchr1.learner.train.model import DistInfo, load_critic, load_policy, load_reference, resolve_device
from searchr1.learner.train.optim import build_optimizer
from searchr1.learner.train.precision import precision, publish_dtype
from searchr1.learner.train.trainer import Trainer


@dataclass
class Training:
    """The models and the trainer of one process."""

    trainer: Trainer
    components: list[Component]
    pad_id: int
    publish_dtype: torch.dtype = torch.float32
    """The dtype versions are published in (`weights.dtype`, cast from the fp32 masters)."""

    def vocab_size(self) -> int | None:
        """The policy's input vocabulary (the embedding's rows), None when it cannot be told."""
        policy = self.trainer.policy
        try:
            return int(policy.get_input_embeddings().num_embeddings)
        except (AttributeError, TypeError, ValueError):
            size = getattr(getattr(policy, "config", None), "vocab_size", None)
            return int(size) if size is not None else None


def build_training(settings: LearnerSettings, info: DistInfo, stage_clock: StageClock | None = None) -> Training:
    """Load policy (+ reference, + critic) and their optimizers as the settings ask; the trainer times its
    optimizer steps on `stage_clock` (the learner's)."""
    device = resolve_device(settings.device)
    if device.type == "cpu" and settings.threads:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    a = settings.algorithm
    policy = load_policy(settings, device, info)
    opt, sched = build_optimizer(policy, settings.optim.lr, settings, settings.optim.warmup_ratio)
    components = [Component("policy", policy, opt, sched)]
    need_ref = a.kl_loss_on or a.kl_in_reward
    reference = load_reference(settings, device, info) if need_ref else None
    if reference is not None and a.ref_ema_tau < 1.0:  # an EMA reference is state: checkpointed
        components.append(Component("reference", reference))
    critic_kw: dict[str, Any] = {}
    if a.advantage == "gae":
        critic = load_critic(settings, device, info)
        c_opt, c_sched = build_optimizer(critic, settings.optim.critic_lr, settings, settings.optim.critic_warmup_ratio)
        components.append(Component("critic", critic, c_opt, c_sched))
        critic_kw = {"critic": critic, "critic_optimizer": c_opt, "critic_scheduler": c_sched}
    trainer = Trainer(settings, policy, opt, sched, device=device, info=info, reference=reference,
                      stage_clock=stage_clock, **critic_kw)
    config = getattr(policy, "config", None)
    pad = getattr(config, "pad_token_id", None)
    published = publish_dtype(settings.weights.dtype, precision(settings.model.dtype, device))
    return Training(trainer, components, int(pad) if pad is not None else 0, published)
