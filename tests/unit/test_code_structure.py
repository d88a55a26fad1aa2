"""The product's shape: no import cycle between its modules (imports made only for type checking
count: a cycle there is still two modules that know each other), no module over 400 lines and no
function over 80 lines (generated gRPC stubs aside). Each test lists every offender it finds."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "services"
GENERATED = PACKAGE / "core" / "api"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if GENERATED not in p.parents)


def _cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for name in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(name)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.y", imported="a.z")
    assert _cycles(graph) == [frozenset({"a.x", "a.y"})]


def test_no_import_cycle():
    graph = grimp.build_graph("searchr1", exclude_type_checking_imports=False)
    assert any(m.startswith("searchr1.core.") for m in graph.modules)
    cycles = set(_cycles(graph))
    offenders = sorted(sorted(c) for c in cycles)
    assert not offenders, f"import cycles: {offenders}"


def test_no_module_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in _sources()}
    long = {name: n for name, n in long.items() if n > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _long_functions(path: Path) -> dict[str, int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                out[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    return out


def test_no_function_over_80_lines():
    long: dict[str, int] = {}
    for path in _sources():
        long.update(_long_functions(path))
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
