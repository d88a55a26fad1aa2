"""The tiny world's policy: a Qwen2-architecture causal LM built from config (no pretrained weights),
saved with its tokenizer as one directory that transformers and vLLM load
(`save_pretrained(safe_serialization=True)`).

Default shape: hidden 128, 2 layers, 4 heads of head_dim 32 (vLLM's CPU attention rejects 16), 4 KV
heads, MLP 512, tied embeddings, vocabulary 1,664 (1,024 BPE + 640 name words) → ~0.74M parameters. float32 weights.

`random_model` is the one tiny-Qwen2 factory: test and benchmark support (`tests/support`) builds its
models with it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from searchr1.world.settings import ModelSettings


def model_config(settings: ModelSettings, vocab_size: int, *, pad_token_id: int, eos_token_id: int,
                 bos_token_id: int | None = None):
    """A `Qwen2Config` of shape `settings` over `vocab_size` ids (tied embeddings, float32, no sliding
    window)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_kv_heads,
        head_dim=settings.head_dim,
        max_position_embeddings=settings.max_position,
        rope_theta=settings.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        use_sliding_window=False,
        torch_dtype="float32",
    )


def random_model(settings: ModelSettings, vocab_size: int, *, pad_token_id: int, eos_token_id: int,
                 bos_token_id: int | None = None):
    """A freshly initialised `Qwen2ForCausalLM` (seeded by `settings.init_seed`; the global torch RNG is
    left as it was), in float32, eval mode; its generation config ends at `eos_token_id`, pads with
    `pad_token_id` and has no BOS."""
    import torch
    from transformers import Qwen2ForCausalLM

    cfg = model_config(settings, vocab_size, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                       bos_token_id=bos_token_id)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(settings.init_seed)
    try:
        model = Qwen2ForCausalLM(cfg)
    finally:
        torch.random.set_rng_state(gen_state)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.bos_token_id = None
    return model.float().eval()


def init_model(settings: ModelSettings, tokenizer):
    """The tiny world's fresh policy for `tokenizer`: its vocabulary, EOS and padding (the config's BOS is
    the padding id)."""
    return random_model(settings, len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.pad_token_id)


def save_model(model, tokenizer, out: str | Path) -> Path:
    """Model (safetensors) and tokenizer in one directory."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out


def build_model(settings: ModelSettings, tokenizer_dir: str | Path, out: str | Path) -> Path:
    """Initialise the model for the tokenizer in `tokenizer_dir` and save both into `out`."""
    from searchr1.world.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    return save_model(init_model(settings, tok), tok, out)


def count_parameters(model) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
