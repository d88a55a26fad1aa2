"""GGUF → a plain Hugging Face folder, with transformers' own GGUF reader (no hand-written dequantiser).

transformers loads a Llama GGUF (`from_pretrained(dir, gguf_file=…)`, the `gguf` package dequantises)
but marks the result GGUF-quantised, and `save_pretrained` refuses such a model. So the loaded model's
config loses its `quantization_config`, a plain `AutoModelForCausalLM.from_config` model takes the
loaded state dict (strict: every key must match), and that model is saved as safetensors, next to the
GGUF's tokenizer (with its chat template) and a generation config whose EOS is the tokenizer's.

Writes `prepared.json` in the folder: source, its sha256, the conversion's wall time, parameter count.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MANIFEST = "prepared.json"
"""The file `prepare` writes last in an output folder; a folder without it is incomplete."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """What `prepared.json` records."""

    name: str
    kind: str
    source: str
    sha256: str
    seconds: float
    parameters: int = 0
    dtype: str = ""

    def write(self, out: Path) -> None:
        (out / MANIFEST).write_text(json.dumps(asdict(self), indent=2) + "\n")


def read_prepared(out: Path) -> Prepared | None:
    """The manifest of a finished folder, None when the folder is absent or incomplete."""
    try:
        return Prepared(**json.loads((out / MANIFEST).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def convert_gguf(gguf: Path, out: Path, name: str, sha256: str, dtype: str = "float32",
                 source: str | None = None) -> Prepared:
    """Convert a Llama-family GGUF file into `out` (replaced if present). `dtype`: float32 keeps the
    dequantised weights exactly; bfloat16 halves the folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    t0 = time.perf_counter()
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch_dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch_dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    plain.config.eos_token_id = tok.eos_token_id
    plain.config.pad_token_id = tok.pad_token_id
    plain.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    prepared = Prepared(name=name, kind="gguf", source=source or str(gguf), sha256=sha256,
                        seconds=round(time.perf_counter() - t0, 2),
                        parameters=sum(p.numel() for p in plain.parameters()), dtype=dtype)
    prepared.write(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return prepared


def install_tokenizer(folder: Path, out: Path, name: str, sha256: str, source: str | None = None) -> Prepared:
    """Copy a tokenizer folder (tokenizer.json, vocab, merges, tokenizer_config.json) into `out`, checking
    that transformers loads it."""
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    AutoTokenizer.from_pretrained(tmp)
    prepared = Prepared(name=name, kind="tokenizer", source=source or str(folder), sha256=sha256,
                        seconds=round(time.perf_counter() - t0, 2))
    prepared.write(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return prepared
