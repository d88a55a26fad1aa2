"""`searchr1 world build`: write a world directory, deterministically.

Files (all byte-identical for the same seed and settings; `manifest.json` lists their sha256):
- `corpus.jsonl` — wiki-18 style rows `{"id": "0", "contents": "\\"Title\\"\\ntext"}`, id = row number.
- `train.parquet`, `test.parquet` — Search-R1's row format (`scripts/data_process/nq_search.py`): the
  FlashRAG columns `id`, `question` (stripped, trailing `?`), `golden_answers`, plus `data_source`,
  `prompt` = [{"role": "user", "content": make_prompt(question)}], `ability` = "fact-reasoning",
  `reward_model` = {"style": "rule", "ground_truth": {"target": [...]}}, `extra_info` = {"split",
  "index", "question_type", "entity_kind", "knowledge", "hops", "gold_doc_ids"}.
- `tasks-train.jsonl`, `tasks-test.jsonl` — the same questions as `searchr1.core.schemas.Task` JSON
  (`task_id`, `question`, `golden_answers`, `data_source`, `split`, `metadata` of strings).
- `world.json` — settings, entities (with the `known` flag) and every question with its gold doc ids:
  what the warm start and the self-check read.
- `tokenizer/` — the byte-level BPE tokenizer (`searchr1.world.tokenizer`).
- `model-init/` — the randomly initialised model plus tokenizer (`searchr1.world.model`), loadable by
  transformers and vLLM.

`data_source` carries both the hop count and whether the entity is known
(`world_{known|unknown}_{single|two}_hop`), so any per-data_source report (Search-R1's included) splits
known from unknown without reading `extra_info` (rather than plain names such as `world_single_hop`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from searchr1.core.protocol import make_prompt, normalize_question
from searchr1.world.generator import Question, World, generate_world, split_questions
from searchr1.world.settings import WorldSettings

FILES = ("corpus.jsonl", "train.parquet", "test.parquet", "tasks-train.jsonl", "tasks-test.jsonl", "world.json")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def gold_doc_ids(world: World, q: Question) -> list[int]:
    """Corpus rows of the passages holding each hop's fact, in hop order."""
    return [world.doc_of[h.subject] for h in q.hops]


def question_row(world: World, q: Question, split: str, index: int) -> dict[str, Any]:
    """One Search-R1 parquet row for `q`."""
    question = normalize_question(q.text)
    return {
        "id": f"{split}_{index}",
        "question": question,
        "golden_answers": list(q.answers),
        "data_source": q.data_source,
        "prompt": [{"role": "user", "content": make_prompt(question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(q.answers)}},
        "extra_info": {
            "split": split,
            "index": index,
            "question_type": q.question_type,
            "entity_kind": q.entity_kind,
            "knowledge": "known" if q.known else "unknown",
            "hops": len(q.hops),
            "gold_doc_ids": gold_doc_ids(world, q),
        },
    }


def task_record(world: World, q: Question, split: str, index: int) -> dict[str, Any]:
    """The same question as a `searchr1.core.schemas.Task` JSON object."""
    return {
        "task_id": f"world-{split}-{index}",
        "question": normalize_question(q.text),
        "golden_answers": list(q.answers),
        "data_source": q.data_source,
        "split": split,
        "metadata": {
            "question_type": q.question_type,
            "entity_kind": q.entity_kind,
            "knowledge": "known" if q.known else "unknown",
            "hops": str(len(q.hops)),
            "gold_doc_ids": ",".join(str(i) for i in gold_doc_ids(world, q)),
        },
    }


def _parquet_schema():
    import pyarrow as pa

    return pa.schema([
        ("id", pa.string()),
        ("question", pa.string()),
        ("golden_answers", pa.list_(pa.string())),
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()),
                                    ("ground_truth", pa.struct([("target", pa.list_(pa.string()))]))])),
        ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()),
                                  ("question_type", pa.string()), ("entity_kind", pa.string()),
                                  ("knowledge", pa.string()), ("hops", pa.int64()),
                                  ("gold_doc_ids", pa.list_(pa.int64()))])),
    ])


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=_parquet_schema())
    pq.write_table(table, path, compression="snappy")


def _write_jsonl(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def world_document(world: World, settings: WorldSettings, splits: dict[str, list[Question]]) -> dict[str, Any]:
    return {
        "format": 1,
        "seed": settings.seed,
        "settings": settings.model_dump(mode="json"),
        "entities": world.to_json()["entities"],
        "questions": {
            split: [{"index": i, "question_type": q.question_type, "subject": q.subject,
                     "question": normalize_question(q.text), "answers": list(q.answers),
                     "gold_doc_ids": gold_doc_ids(world, q), "known": q.known, "data_source": q.data_source}
                    for i, q in enumerate(qs)]
            for split, qs in splits.items()
        },
    }


def build_world(settings: WorldSettings, out: str | Path, *, with_tokenizer: bool = True,
                with_model: bool = True, progress=None) -> dict[str, Any]:
    """Write the world directory and return the manifest (also written as `manifest.json`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda msg: None)

    world = generate_world(settings.generator, settings.seed)
    train, test = split_questions(world, settings.generator.test_fraction)
    splits = {"train": train, "test": test}
    say(f"world: {len(world.entities)} entities, {len(train)} train / {len(test)} test questions")

    corpus = world.corpus()
    _write_jsonl([{"id": str(i), "contents": c} for i, c in enumerate(corpus)], out / "corpus.jsonl")
    for split, qs in splits.items():
        write_parquet([question_row(world, q, split, i) for i, q in enumerate(qs)], out / f"{split}.parquet")
        _write_jsonl([task_record(world, q, split, i) for i, q in enumerate(qs)], out / f"tasks-{split}.jsonl")
    (out / "world.json").write_text(json.dumps(world_document(world, settings, splits), indent=1,
                                               ensure_ascii=False) + "\n", encoding="utf-8")
    files = {name: _sha256(out / name) for name in FILES}

    if with_tokenizer:
        from searchr1.world.tokenizer import build_tokenizer

        say("training the byte-level BPE tokenizer")
        build_tokenizer(world, settings.generator, settings.tokenizer, out / "tokenizer")
        for p in sorted((out / "tokenizer").iterdir()):
            files[f"tokenizer/{p.name}"] = _sha256(p)
    if with_model:
        from searchr1.world.model import build_model

        say("building the initial model from config")
        build_model(settings.model, out / "tokenizer", out / "model-init")
        for p in sorted((out / "model-init").iterdir()):
            files[f"model-init/{p.name}"] = _sha256(p)

    by_source: dict[str, dict[str, int]] = {}
    for split, qs in splits.items():
        for q in qs:
            by_source.setdefault(q.data_source, {"train": 0, "test": 0})[split] += 1
    kinds: dict[str, int] = {}
    for e in world.entities:
        key = f"{e.kind}{'_known' if e.known else ''}"
        kinds[key] = kinds.get(key, 0) + 1
    manifest = {
        "format": 1,
        "seed": settings.seed,
        "counts": {
            "documents": len(corpus),
            "entities": dict(sorted(kinds.items())),
            "train": len(train),
            "test": len(test),
            "by_data_source": dict(sorted(by_source.items())),
        },
        "sha256": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def load_world(directory: str | Path) -> tuple[World, dict[str, Any]]:
    """(World, world.json document) from a world directory."""
    doc = json.loads((Path(directory) / "world.json").read_text(encoding="utf-8"))
    return World.from_json(doc), doc
