"""A tiny random Qwen2 causal LM and a small offline tokenizer, built from config for tests and
benchmarks (no model hub): `build_tiny_lm(dest)` writes an HF `save_pretrained` directory
(safetensors + tokenizer) that vLLM's CPU build and transformers both load.

The tokenizer is a byte-level BPE trained on a few lines, so it encodes any text. The chat tokens
(`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) are *special* tokens; the Search-R1 tags
(`<think> </think> <search> </search> <information> </information> <answer> </answer>`) are *added,
non-special* tokens, as in Qwen: each is one id, and it survives `skip_special_tokens=True`, so vLLM's
stop strings `</search>` / `</answer>` match on the detokenised text.

The model comes from the tiny world's factory (`searchr1.world.model.random_model`). Sizes respect
vLLM CPU limits (docs/architecture.md, "Platform notes"): head_dim 32 (16 is rejected), 2 layers,
hidden 64.
"""

from __future__ import annotations

from pathlib import Path

from searchr1.core.protocol import TAG_TOKENS
from searchr1.world.settings import ModelSettings

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""Qwen's ChatML layout, without the default system message."""

_TRAINING_LINES = (
    ("Answer the given question. You must conduct reasoning inside think first every time you get new "
     "information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
     "search query and it will return the top searched results between information. You can search as many "
     "times as your want. If you find no further external knowledge needed, you can directly provide the "
     "answer inside answer, without detailed illustrations. For example, Beijing. Question: "),
    "Doc 1(Title: Paris) Paris is the capital and most populous city of France.",
    "Doc 2(Title: Berlin) Berlin is the capital of Germany and its largest city.",
    "Doc 3(Title: Rome) Rome is the capital city of Italy, founded long ago.",
    "who wrote the novel? when was the bridge built? what is the capital of the country? where is it?",
    ("My previous action is invalid. If I want to search, I should put the query between search. "
     "If I want to give the final answer, I should put the answer between answer. Let me try again."),
    "I need to find the answer. Let me search for it. The answer is the city of the river and the mountain.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 1999 2024 a an the of in on at to for from by with and or not",
)


TINY_MODEL = ModelSettings(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                           max_position=4096, init_seed=0)
"""Shape of the tiny model (fits vLLM CPU and starts in seconds)."""

VOCAB_SIZE = 512
"""Tokenizer vocabulary (BPE, chat tokens and tags together)."""


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A `PreTrainedTokenizerFast` (byte-level BPE) with chat and Search-R1 tag tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    n_added = len(SPECIAL_TOKENS) + len(TAG_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_added,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TRAINING_LINES * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(list(TAG_TOKENS), special_tokens=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    return fast


def build_tiny_lm(dest: str | Path, model: ModelSettings = TINY_MODEL, vocab_size: int = VOCAB_SIZE) -> Path:
    """Write a random tiny Qwen2 model and its tokenizer to `dest` (safetensors); returns `dest`."""
    from searchr1.world.model import random_model

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    lm = random_model(model, max(vocab_size, len(tokenizer)), pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id)
    lm.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    return dest


def perturb_weights(src: str | Path, dest: str | Path, scale: float = 0.5, seed: int = 1) -> Path:
    """Copy the model at `src` to `dest` with every weight perturbed by Gaussian noise (a "weight push"
    in tests): loads with transformers and writes safetensors with `save_pretrained`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest = Path(dest)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    model.save_pretrained(dest, safe_serialization=True)
    AutoTokenizer.from_pretrained(src).save_pretrained(dest)
    return dest
