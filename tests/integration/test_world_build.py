"""`searchr1 world build` end to end: byte-identical output for one seed, Search-R1's parquet row shape,
wiki-18 corpus, tasks that validate as `Task`, a tokenizer with the tags as single tokens and a model
that transformers loads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from searchr1.core.protocol import make_prompt, render_prompt
from searchr1.core.schemas import Task
from searchr1.world.generator import COMPANY_SUFFIXES
from searchr1.world.settings import GeneratorSettings
from tests.support.world import SMALL_WORLD_TOML


def _app() -> typer.Typer:
    from searchr1.cli import Groups
    from searchr1.world.commands import register

    app = typer.Typer()
    groups = Groups(app)
    register(groups)
    app.add_typer(groups.world, name="world")
    return app


def _build(out: Path, seed: int, config: Path) -> None:
    r = CliRunner().invoke(_app(), ["world", "build", "--seed", str(seed), "--out", str(out), "--config", str(config)])
    assert r.exit_code == 0, r.output


def _digests(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("cfg") / "world-small.toml"
    p.write_text(SMALL_WORLD_TOML)
    return p


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory, config) -> Path:
    out = tmp_path_factory.mktemp("world") / "w"
    _build(out, 3, config)
    return out


def test_same_seed_is_byte_identical_other_seed_differs(world_dir, config, tmp_path):
    _build(tmp_path / "again", 3, config)
    first, again = _digests(world_dir), _digests(tmp_path / "again")
    assert first == again
    assert {"corpus.jsonl", "train.parquet", "test.parquet", "tokenizer/tokenizer.json",
            "model-init/model.safetensors", "manifest.json"} <= set(first)
    _build(tmp_path / "other", 4, config)
    other = _digests(tmp_path / "other")
    assert other["corpus.jsonl"] != first["corpus.jsonl"]


def test_manifest_lists_files_with_their_sha256(world_dir):
    manifest = json.loads((world_dir / "manifest.json").read_text())
    assert manifest["seed"] == 3
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256((world_dir / name).read_bytes()).hexdigest() == digest, name
    c = manifest["counts"]
    assert c["documents"] == 24 + 6 + 5 + 3
    assert sum(v["train"] + v["test"] for v in c["by_data_source"].values()) == c["train"] + c["test"]


def test_corpus_is_wiki18_style(world_dir):
    rows = [json.loads(line) for line in (world_dir / "corpus.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [str(i) for i in range(len(rows))]
    for r in rows:
        assert set(r) == {"id", "contents"}
        title, text = r["contents"].split("\n", 1)
        assert title.startswith('"') and title.endswith('"') and text


def test_parquet_rows_have_search_r1_shape(world_dir):
    import pyarrow.parquet as pq

    corpus = [json.loads(line)["contents"] for line in (world_dir / "corpus.jsonl").read_text().splitlines()]
    for split in ("train", "test"):
        table = pq.read_table(world_dir / f"{split}.parquet")
        assert table.column_names == ["id", "question", "golden_answers", "data_source", "prompt", "ability",
                                      "reward_model", "extra_info"]
        rows = table.to_pylist()
        assert rows
        sources = set()
        for i, row in enumerate(rows):
            assert row["id"] == f"{split}_{i}"
            assert row["question"].endswith("?") and row["question"] == row["question"].strip()
            assert row["prompt"] == [{"role": "user", "content": make_prompt(row["question"])}]
            assert row["prompt"][0]["content"].startswith("Answer the given question. You must conduct reasoning")
            assert row["ability"] == "fact-reasoning"
            assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": row["golden_answers"]}}
            info = row["extra_info"]
            assert info["split"] == split and info["index"] == i
            assert info["knowledge"] in ("known", "unknown") and info["hops"] in (1, 2)
            assert row["data_source"] == (f"world_{info['knowledge']}_{'single' if info['hops'] == 1 else 'two'}_hop")
            assert len(info["gold_doc_ids"]) == info["hops"]
            # the answer is written in the last hop's gold passage
            assert row["golden_answers"][0] in corpus[info["gold_doc_ids"][-1]]
            sources.add(row["data_source"])
        assert sources == {"world_known_single_hop", "world_known_two_hop", "world_unknown_single_hop",
                           "world_unknown_two_hop"}


def test_tasks_validate_as_core_task(world_dir):
    import pyarrow.parquet as pq

    for split in ("train", "test"):
        tasks = [Task.model_validate(json.loads(line))
                 for line in (world_dir / f"tasks-{split}.jsonl").read_text().splitlines()]
        rows = pq.read_table(world_dir / f"{split}.parquet").to_pylist()
        assert [t.question for t in tasks] == [r["question"] for r in rows]
        assert [t.golden_answers for t in tasks] == [r["golden_answers"] for r in rows]
        assert all(t.split == split and t.metadata["knowledge"] in ("known", "unknown") for t in tasks)
        assert len({t.task_id for t in tasks}) == len(tasks)


def test_tokenizer_round_trip_tags_and_template(world_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(world_dir / "tokenizer"))
    # BPE (≤ 1024 with the tags; a small world may not have enough text for every merge) + the name lexicon
    assert 900 + 640 <= len(tok) <= 1024 + 640
    for tag in ("<think>", "</think>", "<search>", "</search>", "<information>", "</information>",
                "<answer>", "</answer>"):
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, tag
        # not special: kept when special tokens are skipped (vLLM's default detokenisation)
        assert tok.decode(ids, skip_special_tokens=True) == tag
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    for text in ("<think> Ünïcode ☃ and 😀 </think>\n<search>  two  spaces </search>", "plain \t tab\n\n",
                 '"Zzqx Vrrl"\nZzqx Vrrl was born in 1999.'):
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    prompt = render_prompt("In which city was Abc Def born?", tok)
    assert prompt == f"<|im_start|>user\n{make_prompt('In which city was Abc Def born?')}<|im_end|>\n<|im_start|>assistant\n"
    n = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert n < 0.3 * len(prompt), f"the Search-R1 prompt should tokenize compactly: {n} tokens"


def test_every_name_word_is_one_token(world_dir):
    """Names are copied out of passages token by token: every name word (with its leading space) is one
    token, in the target world and in the warm start's fresh worlds alike (one lexicon)."""
    from transformers import AutoTokenizer

    from searchr1.world.build import load_world
    from searchr1.world.generator import generate_world

    tok = AutoTokenizer.from_pretrained(str(world_dir / "tokenizer"))
    world, doc = load_world(world_dir)
    gen = GeneratorSettings.model_validate(doc["settings"]["generator"])
    fresh = generate_world(gen, 1_000_000_007, known=world.known_entities())
    for e in [*world.entities, *fresh.entities]:
        for w in e.name.split():
            if w not in COMPANY_SUFFIXES:
                assert len(tok(" " + w, add_special_tokens=False)["input_ids"]) == 1, w
    sentence = world.fact_sentence(world.entities[-1], sorted(world.entities[-1].attrs)[0])
    ids = tok(" " + sentence, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == " " + sentence


def test_initial_model_loads_with_transformers(world_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(world_dir / "model-init"))
    tok = AutoTokenizer.from_pretrained(str(world_dir / "model-init"))
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.hidden_size == 128 and cfg.num_hidden_layers == 2
    assert cfg.num_attention_heads == 4 and cfg.head_dim == 32 and cfg.tie_word_embeddings
    assert cfg.eos_token_id == tok.eos_token_id and cfg.vocab_size == len(tok)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert 700_000 < n < 800_000  # 0.74M: the 1,664-token vocabulary (tied) is a quarter of it
    ids = torch.tensor([tok("<think> hi", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all()
    assert (world_dir / "model-init" / "model.safetensors").is_file()
