"""The learner's LoRA and gradient checkpointing on a real pretrained Llama (SmolLM2-135M-Instruct,
prepared once per machine): one GRPO step each on a batch of the real tokenizer's ids.

- gradient checkpointing: the same step as without it (loss and gradient norm), weights updated;
- LoRA: only the adapters train, the base weights stay bit-identical, and the exported snapshot is a
  plain Llama state dict (no `lora_` keys, the adapter merged) that differs from the base where the
  adapters sit and nowhere else.
"""

from __future__ import annotations

import pytest
import torch

from searchr1.core.protocol import observation_for, render_prompt
from searchr1.core.schemas import Task, Trajectory, TrajectoryGroup
from tests.support.real_models import prepared, tokenizer

pytestmark = pytest.mark.slow  # ~5 min on 2 shared cores: `-m slow`

torch.set_num_threads(2)


def _batch():
    from searchr1.learner.algo.batch import build_batch

    tok = tokenizer("smollm2-135m")
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = enc(render_prompt("what is the capital of france", tok))
    turns = [("<think>I should search.</think>\n<search> capital of France </search>", True),
             (observation_for(["France\nParis is the capital of France."]), False),
             ("<think>Found it.</think>\n<answer> Paris </answer><|im_end|>", True)]
    trajs = []
    for k, reward in enumerate([1.0, 0.0, 1.0, 0.0]):
        ids, mask = [], []
        for text, sampled in turns[: 3 if reward else 1]:
            t = enc(text if k < 2 else text.replace("France", "Lyon"))
            ids += t
            mask += [int(sampled)] * len(t)
        trajs.append(Trajectory(prompt_ids=prompt, response_ids=ids, loss_mask=mask,
                                behavior_logprobs=[-1.0 * m for m in mask], reward=reward))
    group = TrajectoryGroup(task=Task(task_id="t", question="q?", group_size=4), policy_version=0,
                            sampling_temperature=1.0, worker_id="w", trajectories=trajs)
    return build_batch([group], pad_id=tok.pad_token_id)


def _training(**model):
    from searchr1.learner.settings import LearnerSettings
    from searchr1.learner.train.build import build_training
    from searchr1.learner.train.model import DistInfo

    s = LearnerSettings(model={"path": str(prepared("smollm2-135m")), **model}, device="cpu", seed=0,
                        algorithm={"advantage": "grpo", "use_kl_loss": False, "entropy_coef": 0.0},
                        optim={"lr": 1e-4, "weight_decay": 0.0}, batch={"micro_batch_size": 4})
    return build_training(s, DistInfo())


def test_gradient_checkpointing_step_matches_the_plain_step():
    batch = _batch()
    plain = _training().trainer.train_step(batch, version=0)
    training = _training(gradient_checkpointing=True)
    policy = training.trainer.policy
    assert policy.is_gradient_checkpointing
    w0 = policy.model.layers[0].self_attn.q_proj.weight.detach().clone()
    ckpt = training.trainer.train_step(batch, version=0)
    assert ckpt["pg_loss"] == pytest.approx(plain["pg_loss"], rel=1e-4, abs=1e-6)
    assert ckpt["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-3)
    assert not torch.equal(policy.model.layers[0].self_attn.q_proj.weight, w0)


def test_lora_step_trains_adapters_only_and_exports_merged_llama_weights():
    from safetensors.torch import load_file

    from searchr1.learner.train.model import DistInfo, export_weights

    training = _training(lora={"enabled": True, "r": 8, "alpha": 16})
    policy = training.trainer.policy
    base = {k: v.detach().clone() for k, v in policy.get_base_model().state_dict().items() if "lora_" not in k}
    stats = training.trainer.train_step(_batch(), version=0)
    assert stats["grad_norm"] > 0
    after = {k: v for k, v in policy.get_base_model().state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base[k], after[k]) for k in base)  # the base weights never move
    _, exported = export_weights(policy, DistInfo())
    folder = prepared("smollm2-135m")
    original = load_file(str(folder / "model.safetensors"))
    assert set(exported) == set(original)  # a plain Llama state dict: no adapter keys
    changed = {k for k in original if not torch.equal(exported[k], original[k])}
    assert changed and all(k.split(".")[-2] in ("q_proj", "k_proj", "v_proj", "o_proj") for k in changed)
