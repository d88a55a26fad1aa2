"""docs/python.md as written: every ```python block, in order, in one namespace, run in a directory laid out
as the page says (the committed warm start at assets/tiny-world/warmstart; the tiny world and its BM25 index
at runs/world). The blocks carry their own asserts; a block that raises fails the test with its number."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "python.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def doc_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def test_the_page_has_the_blocks_it_promises():
    blocks = doc_blocks(DOC.read_text())
    assert len(blocks) >= 6
    joined = "\n".join(blocks)
    for name in ("score(", "ask(", "open_asker(", "evaluate(", "retriever_search(", "ScoringError"):
        assert name in joined, name


def test_every_block_runs_as_written(tiny_world, tmp_path, monkeypatch, capsys):
    world, index, _ = tiny_world
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    (tmp_path / "runs" / "world").mkdir(parents=True)
    for f in world.iterdir():
        (tmp_path / "runs" / "world" / f.name).symlink_to(f)
    (tmp_path / "runs" / "world" / "index").symlink_to(index)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    for i, block in enumerate(doc_blocks(DOC.read_text()), 1):
        try:
            exec(compile(block, f"docs/python.md block {i}", "exec"), namespace)  # noqa: S102 - the doc's own code
        except Exception as exc:
            raise AssertionError(f"block {i} of docs/python.md failed: {exc!r}\n{block}") from exc
    out = capsys.readouterr().out
    assert "Pass prompt=" in out and "answer: Sous Foundry" in out
    assert (tmp_path / "runs" / "eval-api" / "eval.json").is_file()
