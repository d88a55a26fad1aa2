"""Nothing in the product unpickles: a static scan of services/ for pickle and its relatives
(`pickle`/`cPickle`/`dill`/`cloudpickle`/`joblib.load`/`shelve`, `torch.load` without
`weights_only=True`, `np.load`/`numpy.load` with `allow_pickle=True`, pandas `read_pickle`). Each finding
names file:line. The scan reads the syntax tree, so comments and docstrings that mention these names do
not count; the scanner itself is checked against snippets that must be caught."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"
BANNED_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal"}


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def findings(source: str, filename: str) -> list[str]:
    """Every unpickling construct in `source`, as 'file:line: what'."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in BANNED_MODULES:
                    out.append(f"{where}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in BANNED_MODULES:
            out.append(f"{where}: imports from {node.module}")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            last = name.rsplit(".", 1)[-1]
            if name == "torch.load" and not _is_true(_keyword(node, "weights_only")):
                out.append(f"{where}: torch.load without weights_only=True")
            elif name in ("np.load", "numpy.load") and _is_true(_keyword(node, "allow_pickle")):
                out.append(f"{where}: {name}(allow_pickle=True)")
            elif name in ("joblib.load", "pd.read_pickle", "pandas.read_pickle") or last == "read_pickle":
                out.append(f"{where}: {name}")
            elif last == "unpackb" and _keyword(node, "ext_hook") is not None:
                out.append(f"{where}: msgpack ext_hook (custom object decoding)")
    return out


def test_scanner_catches_what_it_must():
    bad = "\n".join([
        "import pickle", "from dill import loads", "import cloudpickle as cp", "torch.load(p)",
        "torch.load(p, weights_only=False)", "np.load(p, allow_pickle=True)", "numpy.load(p, allow_pickle=True)",
        "joblib.load(p)", "pd.read_pickle(p)", "msgpack.unpackb(b, ext_hook=f)",
    ])
    assert len(findings(bad, "x.py")) == 10
    good = "\n".join(["torch.load(p, weights_only=True)", "np.load(p)", "np.load(p, allow_pickle=False)",
                      "msgpack.unpackb(b, raw=False)", "'''pickle is mentioned in a docstring'''",
                      "safetensors.torch.load_file(p)"])
    assert findings(good, "y.py") == []


def test_the_product_never_unpickles():
    files = sorted(SERVICES.rglob("*.py"))
    assert len(files) > 50, "the scan found too few files: is SERVICES right?"
    found = [f for path in files for f in findings(path.read_text(encoding="utf-8"),
                                                  str(path.relative_to(SERVICES.parent)))]
    if found:
        pytest.fail("the product must never unpickle (untrusted bytes would run code):\n  " + "\n  ".join(found))
