"""The transformers fallback engine on the tiny model: one turn's ids and log-probs are consistent with a
teacher-forced forward pass, seeds reproduce, and reload swaps the weights."""

from __future__ import annotations

import pytest

from searchr1.rollout.engine import HfCodec, TurnRequest
from searchr1.rollout.hf_engine import HfGenerator
from tests.support.tiny_lm import build_tiny_lm, perturb_weights


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("hf") / "m")


async def test_hf_generator_turn_logprobs_seed_and_reload(model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    gen = HfGenerator(str(model_dir), threads=1)
    codec = HfCodec(gen.tokenizer())
    prompt = codec.encode("<|im_start|>user\nwhat is the capital of france?<|im_end|>\n<|im_start|>assistant\n")
    req = TurnRequest(prompt_ids=prompt, max_tokens=12, temperature=1.0, top_p=1.0, top_k=-1, seed=3,
                      stop=("</search>", "</answer>"))
    out = await gen.generate(req, "a")
    assert 1 <= len(out.token_ids) <= 12 and out.finish in ("length", "eos", "stop")
    assert out.text == gen.tokenizer().decode(out.token_ids, skip_special_tokens=True)
    again = await gen.generate(req, "b")
    assert again.token_ids == out.token_ids  # same seed, same sample

    # behaviour log-probs equal a teacher-forced forward pass over prompt + sampled ids
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    expected = [float(logp[len(prompt) - 1 + k, t]) for k, t in enumerate(out.token_ids)]
    assert out.logprobs == pytest.approx(expected, abs=1e-4)

    await gen.reload(str(perturb_weights(model_dir, tmp_path / "v1", scale=0.5)))
    changed = await gen.generate(req, "c")
    assert changed.token_ids != out.token_ids or changed.logprobs != pytest.approx(out.logprobs, abs=1e-3)
