"""`searchr1 data fetch`: Search-R1's train and test parquet files, built from the FlashRAG datasets on the
Hugging Face Hub (`RUC-NLPIR/FlashRAG_datasets`) through `datasets`, row for row what Search-R1's
`scripts/data_process/qa_search_train_merge.py` / `qa_search_test_merge.py` write from the same input.

What a row holds (the FlashRAG columns `id`, `question`, `golden_answers`[, `metadata`] kept, then):
- `question`: stripped, with a trailing `?` added when missing (`searchr1.core.protocol.normalize_question`);
- `data_source`: the FlashRAG config name (`nq`, `hotpotqa`, `2wikimultihopqa`, …), as Search-R1 names it;
- `prompt`: `[{"role": "user", "content": make_prefix(question)}]`, the text of
  `searchr1.core.protocol.SEARCH_R1_TEMPLATE` (Search-R1's `make_prefix(template_type='base')`);
- `ability`: `"fact-reasoning"`; `reward_model`: `{"style": "rule", "ground_truth": {"target": golden_answers}}`;
- `extra_info`: `{"split": "train" | "test", "index": row index within its source}`.

The train file concatenates each source's `train` split; the test file each source's `test` split, else
its `dev` split, else its `train` split (Bamboogle, for instance, has only `test`).

Templates: Search-R1 defines only `base`; its instruct runs (Qwen2.5-*-Instruct) train on the same rows
and the trainer wraps the user message in the model's chat template when it reads them. `instruct` is
therefore accepted and writes the same rows, so a config can name the model family it is for; the chat
template is applied at rollout time (`searchr1.core.protocol.render_prompt`).

What this module does not do: read the parquet into tasks (`searchr1.learner.tools.data`), or download the
retrieval corpus and index (`searchr1.retriever.fetch`). `datasets` is imported on use; the hub cache,
offline mode and endpoint follow the usual `HF_*` environment variables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from searchr1.core.datasets import DatasetError
from searchr1.core.protocol import make_prompt, normalize_question

if TYPE_CHECKING:
    import datasets

__all__ = [
    "ABILITY",
    "FLASHRAG_REPO",
    "TEMPLATES",
    "TEST_SOURCES",
    "TRAIN_SOURCES",
    "FetchResult",
    "build_split",
    "eval_split_name",
    "fetch_search_r1_data",
    "search_r1_row",
]

FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets"
"""The hub dataset repository Search-R1 reads; one config per source."""

TRAIN_SOURCES: tuple[str, ...] = ("nq", "hotpotqa")
"""Search-R1's training mix (`scripts/nq_hotpotqa/data_process.sh`)."""

TEST_SOURCES: tuple[str, ...] = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
"""Search-R1's seven evaluation sets, in its order (the paper's Table 3 columns)."""

ABILITY = "fact-reasoning"

TEMPLATES: dict[str, str] = {"base": "search_r1", "instruct": "search_r1"}
"""Data template name → `searchr1.core.protocol` prompt template (see module docstring on `instruct`)."""

Split = Literal["train", "test"]


def search_r1_row(example: Mapping[str, Any], index: int, data_source: str, split: Split,
                  template: str = "base") -> dict[str, Any]:
    """The columns Search-R1 writes for one FlashRAG example (`index`: its position in its source's split).

    Returns the new and changed columns only; the caller keeps the example's other columns."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown data template {template!r}; known: {sorted(TEMPLATES)}")
    raw = example.get("question")
    if not isinstance(raw, str) or not raw.strip():
        raise DatasetError(f"{data_source} {split} row {index}: empty or missing 'question'")
    golds = example.get("golden_answers")
    if golds is None:
        raise DatasetError(f"{data_source} {split} row {index}: missing 'golden_answers'")
    question = normalize_question(raw)
    return {
        "question": question,
        "data_source": data_source,
        "prompt": [{"role": "user", "content": make_prompt(question, TEMPLATES[template])}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
        "extra_info": {"split": split, "index": index},
    }


def eval_split_name(available: Sequence[str]) -> str:
    """The split Search-R1 evaluates on: `test`, else `dev`, else `train`."""
    for name in ("test", "dev", "train"):
        if name in available:
            return name
    raise DatasetError(f"no test, dev or train split among {list(available)}")


def _load_source(repo: str, source: str, revision: str | None, cache_dir: str | None) -> datasets.DatasetDict:
    import datasets

    try:
        return datasets.load_dataset(repo, source, revision=revision, cache_dir=cache_dir)
    except ValueError as exc:  # an unknown config name lists the known ones
        raise DatasetError(f"{repo}: cannot load source {source!r}: {exc}") from exc


def build_split(split: Split, sources: Sequence[str], *, repo: str = FLASHRAG_REPO, template: str = "base",
                revision: str | None = None, cache_dir: str | None = None,
                counts: dict[str, int] | None = None) -> datasets.Dataset:
    """One Search-R1 file's rows: each source's split mapped through `search_r1_row`, concatenated in
    the order given. `counts`, when passed, receives the row count per source."""
    import datasets

    if not sources:
        raise ValueError("no data sources given")
    if len(set(sources)) != len(sources):
        raise ValueError(f"data sources repeat: {list(sources)}")
    if template not in TEMPLATES:
        raise ValueError(f"unknown data template {template!r}; known: {sorted(TEMPLATES)}")
    parts = []
    for source in sources:
        dd = _load_source(repo, source, revision, cache_dir)
        name = "train" if split == "train" else eval_split_name(list(dd.keys()))
        if name not in dd:
            raise DatasetError(f"{repo}/{source} has no {name!r} split (it has {list(dd.keys())})")
        ds = dd[name]

        def fn(example: dict[str, Any], idx: int, _source: str = source) -> dict[str, Any]:
            return search_r1_row(example, idx, _source, split, template)

        parts.append(ds.map(fn, with_indices=True, desc=f"{source} {name}"))
        if counts is not None:
            counts[source] = len(ds)
    return datasets.concatenate_datasets(parts)


@dataclass(frozen=True)
class FetchResult:
    """What `fetch_search_r1_data` wrote."""

    train: Path | None
    test: Path | None
    train_counts: dict[str, int] = field(default_factory=dict)
    test_counts: dict[str, int] = field(default_factory=dict)


def fetch_search_r1_data(out_dir: str | Path, *, train_sources: Sequence[str] = TRAIN_SOURCES,
                         test_sources: Sequence[str] = TEST_SOURCES, repo: str = FLASHRAG_REPO,
                         template: str = "base", revision: str | None = None,
                         cache_dir: str | None = None) -> FetchResult:
    """Write `out_dir/train.parquet` and `out_dir/test.parquet` (Search-R1's file names); an empty
    source list skips that file. Blocking (downloads and writes): call it from a thread in async code."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path | None] = {"train": None, "test": None}
    counts: dict[str, dict[str, int]] = {"train": {}, "test": {}}
    for split, sources in (("train", train_sources), ("test", test_sources)):
        if not sources:
            continue
        ds = build_split(split, sources, repo=repo, template=template,  # type: ignore[arg-type]
                         revision=revision, cache_dir=cache_dir, counts=counts[split])
        path = out / f"{split}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        ds.to_parquet(str(tmp))
        tmp.replace(path)
        paths[split] = path
    return FetchResult(paths["train"], paths["test"], counts["train"], counts["test"])
