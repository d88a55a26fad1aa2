"""Import-linter contracts (pyproject.toml): services never import each other, core imports no heavy ML,
the learner's sub-packages stay in their layers (loop, sources and tools, training runtime, math)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def test_import_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "import-linter is not installed"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([exe], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout
