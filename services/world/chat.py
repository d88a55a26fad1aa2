"""The tiny world's chat tokens (Qwen's ChatML names): the tokenizer adds them as special tokens and the
warm-start traces end an answer with `IM_END`."""

from __future__ import annotations

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
