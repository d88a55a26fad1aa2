"""`searchr1 weights export` on a run whose snapshot the learner's own publisher wrote (the tiny-world warm
start's weights, perturbed, as policy version 3): the folder loads in transformers as it is — the
snapshot's tensors, the base model's tokenizer and chat template, an EOS that ends the chat's turn — in the
dtype asked for; its model card holds the run's step figures, validation curve, evaluation and setting
fingerprint, and the snapshot's digest; a snapshot whose files no longer match its manifest is refused;
`--push-to-hub` uploads the folder (the safetensors over git-LFS) to a local stand-in of the Hub. vLLM's CPU
build loading the folder is the slow test at the end."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from tests.conftest import WARMSTART
from tests.support.archive_fixture import write_step_log
from tests.support.hub_uploads import LocalHubUploads


def _export(*args: str, env: dict | None = None):
    from searchr1.cli import build_app

    return CliRunner().invoke(build_app(), ["weights", "export", *args], env={"COLUMNS": "160", **(env or {})})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """RUN_DIR with weights/v00000003 (the warm start's tensors + 0.01), a step log, a validation curve and an
    evaluation with a fingerprint; and the config naming the base model."""
    import torch
    from transformers import AutoModelForCausalLM

    from searchr1.rollout.evaluation.report import write_outputs
    from searchr1.weightsync import WeightPublisher

    run = tmp_path_factory.mktemp("runs") / "tiny-grpo"
    model = AutoModelForCausalLM.from_pretrained(WARMSTART, dtype=torch.float32)
    state = {k: (v + 0.01 if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    WeightPublisher(run / "weights", keep=3).write(3, model, state)
    write_step_log(run, steps=5)
    with (run / "learner" / "default.jsonl").open("a") as f:
        f.write(json.dumps({"step": 6, "reward_mean": 0.625, "em_mean": 0.5, "searches_per_trajectory": 1.25}) + "\n")
    (run / "validation.jsonl").write_text(json.dumps({"step": 5, "version": 3, "searchr1_em": 0.4, "em": 0.45,
                                                      "cover_em": 0.5, "f1": 0.55, "failed": 0}) + "\n")
    rec = {"qid": "q", "mode": "greedy", "sample": 0, "data_source": "nq", "question": "q", "golden_answers": ["a"],
           "response": "r", "answer": "a", "finish_reason": "answer", "num_turns": 1, "num_searches": 1,
           "response_tokens": 3, "generated_tokens": 3, "em": 1.0, "cover_em": 1.0, "f1": 1.0, "searchr1_em": 1.0,
           "format_valid": 1.0, "error": None}
    fingerprint = {"id": "f" * 64, "top_k": 3, "retriever": {"kind": "bm25", "count": 150,
                                                            "corpus": {"name": "corpus.jsonl", "sha256": "c" * 64}}}
    write_outputs(run / "eval-after", [rec], {"model": str(run / "final-model"), "fingerprint": fingerprint},
                  ("data_source",))
    config = run.parent / "run.toml"
    config.write_text(f'[learner.model]\npath = "{WARMSTART}"\n[learner.optim]\nlr = 2e-5\ntotal_steps = 6\n')
    return run, config, state


def test_the_folder_loads_in_transformers_with_tokenizer_chat_template_and_card(run, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, config, state = run
    out = tmp_path / "export"
    r = _export(str(run_dir), "--out", str(out), "-c", str(config))
    assert r.exit_code == 0, r.output
    assert "exported version 3" in r.stdout
    model = AutoModelForCausalLM.from_pretrained(out)
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in loaded)  # the snapshot's tensors, not the base's
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                         add_generation_prompt=True).endswith("<|im_start|>assistant\n")
    gen = json.loads((out / "generation_config.json").read_text())
    eos = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    assert tok.convert_tokens_to_ids("<|im_end|>") in eos and "stop_strings" not in gen
    ids = tok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]  # generate as is
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers")
    assert "| last | 6 | 0.625 | 0.5 | 1.25 |" in card  # the step log's last step
    assert "| 5 | 3 | 0.4 | 0.45 | 0.5 | 0.55 | 0 |" in card  # the validation curve
    assert "| eval-after | final-model | 1 | 1 | 1 | 1 | 1 | 1 | 1 | 0 | `ffffffffffff` |" in card
    assert f"fingerprint id: `{'f' * 64}`" in card and "| learning rate | 2e-05 |" in card
    from searchr1.weightsync import manifest_digest

    digest = manifest_digest((run_dir / "weights" / "v00000003" / "snapshot.manifest.json").read_bytes())
    assert f"digest `{digest}` (its files verified against its manifest" in card
    assert hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest() in card


def test_dtype_and_refusals(run, tmp_path):
    import torch
    from safetensors import safe_open

    run_dir, config, _ = run
    out = tmp_path / "bf16"
    r = _export(str(run_dir), "--out", str(out), "--base", str(WARMSTART), "--dtype", "bfloat16")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    again = _export(str(run_dir), "--out", str(out), "--base", str(WARMSTART))
    assert again.exit_code == 2 and "is not empty" in again.stderr
    assert _export(str(run_dir), "--out", str(out), "--base", str(WARMSTART), "--force").exit_code == 0
    bad = _export(str(run_dir), "--out", str(tmp_path / "x"), "--base", str(WARMSTART), "--dtype", "int8")
    assert bad.exit_code == 2 and "--dtype must be one of" in bad.stderr
    missing = _export(str(run_dir), "--out", str(tmp_path / "x"), "--base", str(WARMSTART), "--version", "9")
    assert missing.exit_code == 2 and "no published version 9" in missing.stderr and "[3]" in missing.stderr
    nobase = _export(str(run_dir), "--out", str(tmp_path / "x"))
    assert nobase.exit_code == 2 and "give --base DIR" in nobase.stderr
    torn = tmp_path / "torn"
    shutil.copytree(run_dir / "weights", torn / "weights")
    weights = torn / "weights" / "v00000003" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    r = _export(str(torn), "--out", str(tmp_path / "y"), "--base", str(WARMSTART))
    assert r.exit_code == 2 and "do not match its manifest" in r.stderr and not (tmp_path / "y").exists()


def test_a_version_published_as_a_delta_is_rebuilt(tmp_path):
    """Versions 0–4 published by the real snapshot transport with a full every 3 (fulls 0 and 3, deltas 1–4):
    the newest, 4, exists only as a delta; the export rebuilds it and the folder holds its exact tensors."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from searchr1.streams import StreamKeys
    from searchr1.weightsync import DeltaSettings, SnapshotTransport, VersionChain, WeightPublisher
    from tests.support.delta_versions import Versions

    run = tmp_path / "run"
    versions = Versions.of(WARMSTART)
    pub = WeightPublisher(run / "weights", keep=2)
    transport = SnapshotTransport(pub, None, StreamKeys("x"),
                                  chain=VersionChain(DeltaSettings(full_every=3, max_share=1.0)))
    for v in range(5):
        asyncio.run(versions.publish(transport, v))
    assert pub.versions() == [0, 3] and pub.deltas() == [1, 2, 3, 4]
    r = _export(str(run), "--out", str(tmp_path / "out"), "--base", str(WARMSTART))
    assert r.exit_code == 0, r.output
    assert "exported version 4 (bfloat16)" in r.stdout
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    expected = versions.state(4)
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)
    assert "published as a delta: rebuilt from the newest full version" in (tmp_path / "out" / "README.md").read_text()


def test_push_to_a_hub(run, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)  # the stand-in speaks LFS only
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the tests' default; this hub is local
    run_dir, config, _ = run
    out = tmp_path / "push"
    with LocalHubUploads(tmp_path / "hub", token="hf_test") as hub:
        r = _export(str(run_dir), "--out", str(out), "-c", str(config), "--push-to-hub", "me/tiny-searcher",
                    "--hub-endpoint", hub.endpoint, env={"HF_TOKEN": "hf_test"})
        assert r.exit_code == 0, r.output
        assert "pushed to me/tiny-searcher" in r.stdout
        assert hub.repos == {"me/tiny-searcher": {"private": False}}
        assert hub.card_meta["library_name"] == "transformers" and "searchr1" in hub.card_meta["tags"]
        (commit,) = hub.commits
        assert set(commit["files"]) == {p.name for p in out.iterdir()}
        for p in out.iterdir():
            assert (tmp_path / "hub" / "me" / "tiny-searcher" / p.name).read_bytes() == p.read_bytes()
        assert any(method == "PUT" for method, _ in hub.requests)  # the weights went over LFS
        refused = _export(str(run_dir), "--out", str(tmp_path / "p2"), "-c", str(config), "--push-to-hub", "me/x",
                          "--hub-endpoint", hub.endpoint, env={"HF_TOKEN": "wrong"})
    assert refused.exit_code == 1 and refused.stderr.startswith("error: push to me/x failed")


@pytest.mark.slow
def test_vllm_loads_the_folder_and_generates_what_transformers_does(run, tmp_path):
    """vLLM's CPU build on the exported folder: greedy tokens equal transformers' (float32)."""
    import subprocess
    import sys

    run_dir, config, _ = run
    out = tmp_path / "vllm"
    assert _export(str(run_dir), "--out", str(out), "-c", str(config)).exit_code == 0
    script = f"""
import json
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained({str(out)!r})
    prompt = tok.apply_chat_template([{{"role": "user", "content": "Which company does Nalfo Traincirk work for?"}}],
                                     add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, add_special_tokens=False).input_ids
    llm = LLM(model={str(out)!r}, dtype="float32", gpu_memory_utilization=0.1, enforce_eager=True, max_model_len=1024)
    got = llm.generate({{"prompt_token_ids": ids}}, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].token_ids
    import torch
    ref = AutoModelForCausalLM.from_pretrained({str(out)!r}).generate(torch.tensor([ids]), max_new_tokens=12,
                                                                      do_sample=False)[0][len(ids):].tolist()
    print("RESULT " + json.dumps({{"vllm": list(got), "hf": ref}}), flush=True)
"""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    n = len(result["vllm"])
    assert n > 0 and result["vllm"] == result["hf"][:n]
