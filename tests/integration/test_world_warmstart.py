"""Warm start on a tiny world: the loss mask is exactly the environment's tokens, micro-batching changes
nothing in the gradient, a short run lowers the loss and starts answering in the protocol's format, and the
saved directory loads and carries its report."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from searchr1.core.protocol import render_prompt
from searchr1.core.settings import load_settings
from searchr1.weightsync import snapshot_digest
from searchr1.world.settings import WarmstartSettings, WorldSettings
from tests.support.world import SMALL_WORLD_TOML


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    import torch

    from searchr1.world.build import build_world

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ws")
    (root / "small.toml").write_text(SMALL_WORLD_TOML)
    out = root / "world"
    build_world(load_settings(WorldSettings, root / "small.toml", seed=1), out, with_model=False)
    return out


@pytest.fixture(scope="module")
def parts(world_dir):
    from searchr1.world.build import load_world
    from searchr1.world.model import init_model
    from searchr1.world.settings import GeneratorSettings, ModelSettings
    from searchr1.world.sft_data import TraceSampler
    from searchr1.world.tokenizer import load_tokenizer

    world, doc = load_world(world_dir)
    tok = load_tokenizer(world_dir / "tokenizer")
    gen = GeneratorSettings.model_validate(doc["settings"]["generator"])
    sampler = TraceSampler(gen, world.known_entities(), [e.name for e in world.entities if not e.known],
                           WarmstartSettings(seed=3))
    return world, doc, tok, sampler, init_model(ModelSettings(), tok)


def test_labels_mask_exactly_the_prompt_and_the_observations(parts):
    from searchr1.world.sft_data import IGNORE, encode_trace

    _, _, tok, sampler, _ = parts
    traces = [t for t in sampler.batch(0, 64) if t.searches >= 1][:6]
    assert traces
    for t in traces:
        ids, labels = encode_trace(tok, t)
        prompt_ids = tok(render_prompt(t.question, tok), add_special_tokens=False)["input_ids"]
        assert ids[: len(prompt_ids)] == prompt_ids and all(x == IGNORE for x in labels[: len(prompt_ids)])
        pos = len(prompt_ids)
        for seg in t.segments:
            seg_ids = tok(seg.text, add_special_tokens=False)["input_ids"]
            assert ids[pos: pos + len(seg_ids)] == seg_ids
            expected = seg_ids if seg.policy else [IGNORE] * len(seg_ids)
            assert labels[pos: pos + len(seg_ids)] == expected
            if not seg.policy:
                assert tok.decode(seg_ids).startswith("\n\n<information>")
            pos += len(seg_ids)
        assert pos == len(ids) == len(labels)
        # the trained tokens decode to the policy's text and end with EOS
        trained = [x for x in labels if x != IGNORE]
        assert tok.decode(trained) == "".join(s.text for s in t.segments if s.policy)
        assert trained[-1] == tok.eos_token_id


def test_micro_batched_gradient_equals_one_padded_batch(parts):
    import torch

    from searchr1.world.sft_data import collate, encode_trace
    from searchr1.world.training import step_loss_backward

    _, _, tok, sampler, model = parts
    examples = [encode_trace(tok, t) for t in sampler.batch(0, 6)]
    model.zero_grad()
    loss, n = step_loss_backward(model, examples, tok.pad_token_id, max_tokens=400)
    micro = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    ids, att, lab = collate(examples, tok.pad_token_id)
    full = model(input_ids=ids, attention_mask=att, labels=lab).loss
    full.backward()
    assert n == sum(sum(1 for x in lab[1:] if x != -100) for _, lab in examples)
    assert loss == pytest.approx(float(full.detach()), rel=1e-5)
    for k, p in model.named_parameters():
        assert torch.allclose(p.grad, micro[k], atol=1e-6, rtol=1e-4), k
    model.zero_grad()


def test_short_warm_start_lowers_the_loss_and_writes_a_loadable_model(world_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from searchr1.world.build import load_world
    from searchr1.world.checks import self_check
    from searchr1.world.warmstart import run_warmstart

    ws = WarmstartSettings(steps=24, batch_size=8, lr=3e-3, warmup_steps=4, log_every=4, eval_questions=0,
                           threads=1, seed=0, copy_steps=8, copy_batch_size=4)
    out = tmp_path / "model"
    report = run_warmstart(world_dir, out, ws, show_progress=False)
    losses = [loss for _, loss in report["losses"]]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.75 * losses[0], losses
    assert report["steps"] == 24 and report["seed"] == 0 and sum(report["trace_kinds"].values()) == 24 * 8
    copied = report["copy_pretraining"]
    assert copied["steps"] == 8 and [s for s, _ in copied["losses"]] == [4, 8] and 0 <= copied["final_accuracy"] <= 1
    assert 0.0 <= report["reading"]["value_token_accuracy"] <= 1.0

    saved = json.loads((out / "warmstart.json").read_text())
    assert saved["sha256"] == report["sha256"]
    bare = tmp_path / "bare"
    shutil.copytree(out, bare)
    (bare / "warmstart.json").unlink()
    assert snapshot_digest(bare) == report["sha256"]

    model = AutoModelForCausalLM.from_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    world, doc = load_world(world_dir)
    check = self_check(model, tok, world, doc["questions"]["test"][:2], topk=3, max_searches=1,
                       max_turn_tokens=24)
    assert check["n"] == 2 and 0.0 <= check["em"] <= 1.0
    # the format is the first thing learned: every greedy response opens with a think
    assert all(s.startswith("<think>") for s in check["samples"]), check["samples"]

    # a warm start can continue from a checkpoint: it starts near where the first one ended
    more = run_warmstart(world_dir, tmp_path / "more", ws.model_copy(update={"steps": 4, "warmup_steps": 0}),
                         show_progress=False, init=out)
    assert more["init"] == str(out) and more["losses"][0][1] < 0.9 * losses[0]
    assert more["copy_pretraining"] is None  # a continued model has had its copy pre-training
    # the report describes the loaded model's own config, not the world's model settings
    assert more["model"]["hidden_size"] == model.config.hidden_size
    assert more["model"]["vocab_size"] == model.config.vocab_size and "init_seed" not in more["model"]


def test_sampler_is_deterministic_and_refreshes_the_world(parts, world_dir):
    from searchr1.world.sft_data import TraceSampler

    world, _, _, sampler, _ = parts
    ws = WarmstartSettings(seed=5, refresh_steps=2)

    def run():
        s = TraceSampler(sampler.generator, world.known_entities(), sampler.reserved_names, ws)
        texts = [t.response_text for step in range(4) for t in s.batch(step, 4)]
        return texts, s.world

    a, last_world = run()
    b, _ = run()
    assert a == b
    first = TraceSampler(sampler.generator, world.known_entities(), sampler.reserved_names, ws)
    first.batch(0, 1)
    def unknown(w):
        return {e.name for e in w.entities if not e.known}
    assert unknown(first.world) != unknown(last_world)
    assert not unknown(last_world) & {e.name for e in world.entities}


class _Oracle:
    """A stand-in 'model' whose greedy next token is the true one (or, with `wrong`, never is): the reading
    probe must score it 1.0 (0.0), which pins its positions to the restated value, off-by-one included."""

    def __init__(self, vocab: int, wrong: bool = False):
        self.vocab, self.wrong = vocab, wrong

    def eval(self):
        return self

    def __call__(self, input_ids):
        import torch

        ids = input_ids[0]
        logits = torch.zeros(1, len(ids), self.vocab)
        nxt = torch.cat([ids[1:], ids[-1:]])
        if self.wrong:
            nxt = (nxt + 1) % self.vocab
        logits[0, torch.arange(len(ids)), nxt] = 1.0
        return type("Out", (), {"logits": logits})()


def test_reading_probe_scores_the_restated_value_tokens(parts):
    from searchr1.world.checks import reading_check, reading_world, value_token_positions
    from searchr1.world.settings import GeneratorSettings

    world, doc, tok, _, _ = parts
    text = "<think> Abc Def was born in the year 1921. </think>\n<answer> 1921 </answer><|im_end|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    positions = value_token_positions(tok, text, "1921")
    assert tok.decode([ids[i] for i in positions]).strip() == "1921"
    assert positions[0] < ids.index(tok.convert_tokens_to_ids("</think>"))  # the restatement, not the answer

    probe = reading_world(GeneratorSettings.model_validate(doc["settings"]["generator"]), world)
    # a world the model never trained on: same known entities, none of the target's unknown names
    assert [e.name for e in probe.known_entities()] == [e.name for e in world.known_entities()]
    assert not {e.name for e in probe.entities if not e.known} & {e.name for e in world.entities}
    right = reading_check(_Oracle(len(tok)), tok, probe, n=8, topk=2)
    wrong = reading_check(_Oracle(len(tok), wrong=True), tok, probe, n=8, topk=2)
    assert right["traces"] == 8 and right["value_token_accuracy"] == 1.0 and right["value_exact"] == 1.0
    assert wrong["value_token_accuracy"] == 0.0 and wrong["value_exact"] == 0.0
