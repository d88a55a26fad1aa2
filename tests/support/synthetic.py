"""Tiny random models and synthetic trajectory groups, for the learner's tests and benchmarks.

No hub access: the model comes from the tiny world's factory (`searchr1.world.model.random_model`) and is
saved with `save_pretrained`; it has no tokenizer (ids are drawn at random). Groups follow the schema's
loss-mask invariant (env tokens masked, behaviour log-probs 0 there).
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from searchr1.core.schemas import Task, Trajectory, TrajectoryGroup


def tiny_qwen2(path: str | Path, *, vocab: int = 256, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """Write a tiny random Qwen2 causal LM (head_dim 32, one KV head, MLP 2 × hidden, fp32; padding id 0,
    EOS and BOS id 1) to `path`; returns the path."""
    from searchr1.world.model import random_model
    from searchr1.world.settings import ModelSettings

    settings = ModelSettings(hidden_size=hidden, num_layers=layers, num_heads=max(1, hidden // 32), num_kv_heads=1,
                             intermediate_size=hidden * 2, max_position=2048, init_seed=seed)
    model = random_model(settings, vocab, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    return path


def qwen2_layer(path: str | Path, *, vocab: int = 2048, layers: int = 1, seed: int = 0) -> Path:
    """Write a random Qwen2 causal LM whose decoder layers have Qwen2.5-0.5B's shapes (hidden 896, MLP 4,864,
    14 query heads and 2 KV heads of 64, tied embeddings; weights N(0, 0.02) as its initialiser draws
    them), over a small vocabulary, to `path`: the recipe's numerics on real-sized matrices (~15M
    parameters a layer). Padding id 0, EOS and BOS id 1. Returns the path."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                         initializer_range=0.02)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    return path


def synthetic_group(
    task_id: str,
    *,
    group_size: int = 4,
    vocab: int = 256,
    prompt_len: int = 8,
    response_len: int = 16,
    policy_version: int = 0,
    rewards: list[float] | None = None,
    rng: random.Random | None = None,
    text_per_token: float = 0.0,
) -> TrajectoryGroup:
    """A group of `group_size` trajectories with random ids; every 4th response token is an
    environment token (loss mask 0); lengths vary a little so padding is exercised. `text_per_token`:
    characters of response text per response token, as a rollout worker's group carries it (0: none)."""
    rng = rng or random.Random(task_id)
    trajs = []
    prompt = [rng.randrange(2, vocab) for _ in range(prompt_len)]
    for i in range(group_size):
        n = max(2, response_len - rng.randrange(0, max(1, response_len // 3)))
        ids = [rng.randrange(2, vocab) for _ in range(n)]
        mask = [0 if (k % 4 == 3) else 1 for k in range(n)]
        beh = [(-rng.uniform(3.0, 7.0) if m else 0.0) for m in mask]
        reward = rewards[i] if rewards is not None else float(rng.random() < 0.5)
        text = "".join(rng.choices(string.ascii_letters + " ", k=int(n * text_per_token)))
        trajs.append(Trajectory(prompt_ids=prompt, response_ids=ids, loss_mask=mask, behavior_logprobs=beh,
                                response_text=text, reward=reward, reward_components={"em": reward}, num_turns=2,
                                num_searches=rng.randrange(0, 3), finish_reason="answer"))
    task = Task(task_id=task_id, question=f"q {task_id}?", golden_answers=["a"], group_size=group_size)
    return TrajectoryGroup(task=task, policy_version=policy_version, sampling_temperature=1.0,
                           worker_id="synthetic", trajectories=trajs)
