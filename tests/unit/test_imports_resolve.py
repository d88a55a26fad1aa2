"""Every `from searchr1… import name` and `import searchr1…` in services/, tests/ and benchmarks/ resolves,
function-local imports included (ruff checks only module-level ones, and a moved module otherwise breaks
only the code path that imports it lazily). Runs in a subprocess so the imports do not leak into the
test session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = r'''
import ast, importlib, pathlib, sys
bad = []
for root in ("services", "tests", "benchmarks"):
    for path in sorted(pathlib.Path(root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("searchr1"):
                try:
                    module = importlib.import_module(node.module)
                except Exception as exc:
                    bad.append(f"{path}:{node.lineno}: {node.module} ({exc!r})")
                    continue
                for alias in node.names:
                    if alias.name == "*" or hasattr(module, alias.name):
                        continue
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except Exception:
                        bad.append(f"{path}:{node.lineno}: {node.module} has no {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("searchr1"):
                        try:
                            importlib.import_module(alias.name)
                        except Exception as exc:
                            bad.append(f"{path}:{node.lineno}: {alias.name} ({exc!r})")
print("\n".join(bad))
sys.exit(1 if bad else 0)
'''


def test_every_searchr1_import_resolves():
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"unresolved imports:\n{done.stdout}{done.stderr[-2000:]}"
