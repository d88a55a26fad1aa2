"""The notebooks in notebooks/ run top to bottom in a real Jupyter kernel (nbclient, ipykernel): the tiny-world
`ask` demo on the committed warm start and the session's tiny world, and the archive analysis on an archive
the learner's writer wrote. Their `parameters` cell is overridden the way papermill does it (a cell after it
setting the values), so the notebooks stay runnable by hand with their defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.archive_fixture import write_archive

ROOT = Path(__file__).resolve().parents[2]
nbformat = pytest.importorskip("nbformat", reason="the dev extra's nbformat is not installed")
nbclient = pytest.importorskip("nbclient", reason="the dev extra's nbclient is not installed")


def run_notebook(name: str, params: dict, cwd: Path):
    """Execute notebooks/NAME with `params` set after its parameters cell; returns the executed notebook."""
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in params.items())))
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def _outputs(nb) -> str:
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            texts.append(out.get("text", "") + str(out.get("data", {}).get("text/plain", "")))
            assert out.get("output_type") != "error", out
    return "\n".join(texts)


def test_ask_on_the_tiny_world(tiny_world, tmp_path):
    world, index, warm = tiny_world
    nb = run_notebook("ask_tiny_world.ipynb", {"repo": str(ROOT), "model_dir": str(warm), "world_dir": str(world),
                                               "index_dir": str(index), "engine": "hf"}, tmp_path)
    text = _outputs(nb)
    assert "--- search\nNalfo Traincirk" in text and "answer: Sous Foundry" in text
    assert "knowledge" in text and "correct" in text


def test_the_archive_analysis(tmp_path):
    write_archive(tmp_path / "run" / "archive", steps=6, groups_per_step=4, every_steps=3)
    nb = run_notebook("archive_analysis.ipynb", {"run_dir": str(tmp_path / "run")}, tmp_path)
    text = _outputs(nb)
    assert "96 trajectories, 8 questions, steps 1–6" in text
    assert any(out.get("output_type") == "display_data" and "image/png" in out.get("data", {})
               for cell in nb.cells for out in cell.get("outputs", []))  # the plots were drawn
