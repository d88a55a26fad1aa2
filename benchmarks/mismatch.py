"""Train–inference mismatch of one engine dtype against the learner in each dtype, same weights:

    .venv/bin/python benchmarks/mismatch.py [--model smollm2-135m|tiny] [--engine-dtype bfloat16]
                                            [--prompts 16] [--max-tokens 64] [--seed 0]

A vLLM CPU engine in `--engine-dtype` samples `--prompts` responses (temperature 1, the sampled token's
log-prob recorded, as a rollout worker does); the learner's forward (transformers, `forward_logprobs`)
then scores the same tokens with the same weights in float32 and in bfloat16. Prints, per learner dtype,
the figures the learner logs every step (`algo/mismatch.MismatchSums`): mean |Δ log p|, the mean and
largest |sequence log-ratio|, the normalised effective sample size of the token ratios over all the
samples (one step's worth), and what `seq_mask` (band [0.999, 1.001]) and `icepop` ([0.5, 5]) would reject.
The floor of the comparison is the learner against itself (fp32 vs fp32: exactly 0). Models: SmolLM2-135M
(`searchr1 models prepare smollm2-135m`, fp32 weights) or the tiny world's random model (built here).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path


def model_dir(name: str) -> Path:
    if name == "tiny":
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.support.tiny_lm import build_tiny_lm

        return build_tiny_lm(Path(tempfile.mkdtemp(prefix="mismatch-")) / "tiny")
    from searchr1.models.prepare import prepare_packaged

    return prepare_packaged(name)[0]


def sample(path: Path, dtype: str, prompts: int, max_tokens: int, seed: int):
    """(prompt ids, response ids, engine log-probs) per sample, from a vLLM CPU engine in `dtype`."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(path)
    questions = [f"Question {i}: who wrote the novel number {i} and in which year was it published?"
                 for i in range(prompts)]
    llm = LLM(model=str(path), dtype=dtype, enforce_eager=True, seed=seed, max_model_len=512,
              gpu_memory_utilization=0.05)
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=seed)
    outs = llm.generate([{"prompt_token_ids": tok(q).input_ids} for q in questions], params)
    rows = []
    for o in outs:
        c = o.outputs[0]
        lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs)]
        rows.append((list(o.prompt_token_ids), list(c.token_ids), lps))
    del llm
    return rows


def learner_figures(path: Path, rows, dtype: str) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from searchr1.learner.algo.mismatch import CorrectionParams, MismatchSums, correction_weights
    from searchr1.learner.train.model import forward_logprobs

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    sums = {name: MismatchSums() for name in ("tis", "seq_mask", "icepop")}
    p = CorrectionParams()
    with torch.no_grad():
        for prompt, resp, lps in rows:
            ids = torch.tensor([prompt + resp])
            mask = torch.zeros(1, ids.shape[1] - 1)
            mask[0, len(prompt) - 1:] = 1.0
            learner, _ = forward_logprobs(model, ids, torch.ones_like(ids), mask=mask)
            engine = torch.zeros_like(learner)
            engine[0, len(prompt) - 1:] = torch.tensor(lps)
            for name, s in sums.items():
                s.add(learner, engine, mask, correction_weights(name, learner, engine, mask, p))
    f = sums["tis"].figures()
    f["seq_mask_rejects"] = sums["seq_mask"].figures()["mismatch_masked_seq_frac"]
    f["icepop_rejects"] = sums["icepop"].figures()["mismatch_masked_token_frac"]
    f["tokens"] = sums["tis"].tokens
    return f


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--engine-dtype", default="bfloat16")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    path = model_dir(a.model)
    rows = sample(path, a.engine_dtype, a.prompts, a.max_tokens, a.seed)
    print(f"model {a.model}; vLLM CPU engine in {a.engine_dtype}; {len(rows)} samples, temperature 1; "
          f"{os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for dtype in ("float32", "bfloat16"):
        f = learner_figures(path, rows, dtype)
        print(f"  learner {dtype:<8}: {int(f['tokens'])} tokens, mean |Δ log p| {f['mismatch_abs_logp_mean']:.3g}, "
              f"sequence log-ratio mean {f['mismatch_seq_log_ratio_mean']:+.3g} (|max| "
              f"{f['mismatch_seq_log_ratio_abs_max']:.3g}), ESS {f['mismatch_ess']:.4f}, seq_mask rejects "
              f"{f['seq_mask_rejects']:.0%} of sequences, icepop {f['icepop_rejects']:.2%} of tokens")


if __name__ == "__main__":
    main()
