"""Each setting is declared once, on its settings field. Runtime classes take their settings section whole
(or the values a caller picked from it), so no class, dataclass or function under `services/` states a
setting's default again: the scan below reads every dataclass field default, pydantic field default and
function parameter default in the package (its source, so nothing heavy is imported) and fails on

- a default that repeats a settings default under the same name (`max_deliveries: int = 3` beside
  `TaskSettings.max_deliveries = 3`), even while the two values agree;
- a default read from a settings field (`default(AgentSettings, "top_k")`): a mirror of the setting.

Settings here are every `Section`, `ServiceSettings` and reward scorer `Params` model, found by the same
scan. A default written as a named constant is one declaration the setting and the code share, and
passes. The few names whose value agrees with some setting's by coincidence are listed in `UNRELATED`,
each with why. The commands that map flags onto a settings class leave every default to it."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer.main
from pydantic import BaseModel

from searchr1.cli import build_app
from searchr1.core.settings import RetrySettings, Section, ServiceSettings

SERVICES = Path(__file__).resolve().parents[2] / "services"
SETTINGS_BASES = {"Section", "ServiceSettings", "Params", "BaseSettings"}
"""A class deriving from one of these (or from a class that does) declares settings."""

UNRELATED: dict[tuple[str, str], str] = {
    # (module under services/, parameter or field): why its default agrees with some setting's by coincidence
    ("core/servers.py", "host"): "a server helper listens on loopback unless told otherwise; every "
                                 "service's `host` setting is passed in",
    ("core/servers.py", "port"): "port 0 asks the OS for a free port (tests); every service passes its own",
    ("core/metrics.py", "host"): "the metrics server's loopback default, as the other server helpers",
    ("core/metrics.py", "port"): "port 0: a free port",
    ("core/redis_server.py", "host"): "the Redis it starts listens on loopback",
    ("core/schemas.py", "group_size"): "a wire schema's defaults are part of its versioned format (an entry "
                                       "without the field reads as 5); the dispatcher stamps every task",
    ("retriever/encoders.py", "pooling"): "an index manifest's encoder record: a manifest written without the "
                                          "field reads it as this (`Manifest.encoder_spec`)",
    ("retriever/encoders.py", "normalize"): "as `pooling`: part of the manifest's format",
    ("retriever/encoders.py", "max_length"): "as `pooling`: part of the manifest's format",
    ("retriever/encoders.py", "device"): "the encoder class serves two tables (`[index.encoder]` for builds, "
                                         "`[retriever.search]` for queries), each passing its own values; "
                                         "its CPU, full-precision defaults are for direct use (benchmarks)",
    ("retriever/encoders.py", "fp16"): "as `device`",
    ("retriever/encoders.py", "bf16"): "as `device`",
    ("retriever/encoders.py", "batch_size"): "as `device`",
    ("retriever/indexes.py", "device"): "the cross-encoder reranker's torch device (web search), no setting",
    ("retriever/indexes.py", "batch_size"): "pairs per reranker forward pass, not the warm start's batch",
    ("retriever/indexes.py", "threads"): "BM25's numba threads, not the warm start's torch threads",
    ("retriever/loading.py", "threads"): "BM25's numba threads, not the warm start's torch threads",
    ("retriever/commands.py", "threads"): "`index convert`'s FAISS threads, not the warm start's torch threads",
    ("retriever/builder.py", "enabled"): "whether a progress bar is drawn",
    ("rollout/commands.py", "seed"): "`rollout once` and `eval` take a sampling seed of their own",
    ("rollout/commands.py", "temperature"): "`eval` samples its K trajectories at temperature 1.0 whatever the "
                                            "agent's setting (the flag sets it)",
    ("world/checks.py", "seed"): "the reading check's own sample of questions",
    ("learner/tools/audit_sources.py", "timeout_s"): "how long the audit waits for the redis-server it starts",
    ("streams/lease.py", "timeout_s"): "how long releasing the lease may take on exit",
    ("streams/link.py", "backoff_s"): "the first wait of the link's Redis retry, which has no setting",
    ("weightsync/broadcast.py", "device"): "the torch device a broadcast receiver stages tensors on",
    ("launcher/placement.py", "workers"): "a placement planned without the launcher's table (the Kubernetes "
                                          "generator) has one worker per GPU group; `searchr1 up` passes "
                                          "`[launcher.rollout] workers`",
    ("simulator/pipeline.py", "max_concurrent"): "the simulator's model of a run, built without importing the "
                                                 "services; `searchr1 plan` fills it from a run config",
    ("simulator/workload.py", "max_turns"): "as the simulator's `max_concurrent`",
    ("simulator/workload.py", "max_tokens_per_turn"): "as the simulator's `max_concurrent`",
    ("simulator/pipeline.py", "seed"): "the simulation's own random seed",
    ("simulator/sizing.py", "seed"): "the simulation's own random seed",
    ("api/commands.py", "temperature"): "`ask` is greedy unless told otherwise (Search-R1's infer.py), whatever the "
                                        "agent's sampling temperature",
    ("api/commands.py", "seed"): "`ask`'s own sampling seed (with --temperature above 0)",
    ("api/evaluating.py", "samples"): "the API's evaluation is greedy only unless asked for samples",
    ("api/evaluating.py", "temperature"): "the temperature of its K sampled trajectories, as `searchr1 eval`'s flag",
    ("api/evaluating.py", "seed"): "the evaluation's own base seed, as `searchr1 eval`'s flag",
    ("api/search.py", "http"): "whether the index served in-process also answers Search-R1's /retrieve",
    ("core/progress.py", "enabled"): "whether a spinner is drawn",
    ("learner/commands.py", "dtype"): "the export's weight dtype: auto keeps the snapshot's",
}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(SERVICES.rglob("*.py")):
        yield path.relative_to(SERVICES).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _settings_classes() -> dict[tuple[str, str], type[BaseModel]]:
    """Every settings class under services/, by (module path, class name): found in the source (a class
    whose base is a settings base, to a fixed point), then imported."""
    trees = dict(_modules())
    bases, declared = set(SETTINGS_BASES), set()
    while True:
        found = {(path, node.name) for path, tree in trees.items() for node in ast.walk(tree)
                 if isinstance(node, ast.ClassDef)
                 and {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases} & bases}
        if found <= declared:
            break
        declared |= found
        bases |= {name for _, name in found}
    classes = {}
    for path, name in declared:
        module = importlib.import_module("searchr1." + path.removesuffix(".py").replace("/", "."))
        cls = getattr(module, name)
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            classes[path, name] = cls
    return classes


SETTINGS = _settings_classes()


def _defaults() -> dict[str, dict[object, list[str]]]:
    """Each settings field name → each default it has → the classes that declare it."""
    out: dict[str, dict[object, list[str]]] = {}
    for cls in SETTINGS.values():
        for name, f in cls.model_fields.items():
            value = None if f.is_required() else f.get_default(call_default_factory=True)
            if isinstance(value, bool | int | float | str):
                out.setdefault(name, {}).setdefault(_key(value), []).append(cls.__name__)
    return out


def _key(value: object) -> object:
    """Compare numbers as numbers (5 and 5.0 are one default), booleans apart from them."""
    return ("bool", value) if isinstance(value, bool) else value


def _is_mirror(expr: ast.expr) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "default"
               for n in ast.walk(expr))


def _literal(expr: ast.expr) -> tuple[bool, object]:
    """(True, value) for a literal default, also inside `Field(...)`/`field(default=...)`."""
    if isinstance(expr, ast.Call) and ast.unparse(expr.func).rsplit(".", 1)[-1] in ("Field", "field"):
        given = [k.value for k in expr.keywords if k.arg == "default"] or expr.args[:1]
        return _literal(given[0]) if given else (False, None)
    try:
        return True, ast.literal_eval(expr)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _defaults_in(tree: ast.Module, skip: set[str]) -> Iterator[tuple[str, ast.expr, str]]:
    """(name, default expression, where) of every class-body field and function parameter default,
    leaving out the settings classes' own fields (`skip`: their names)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name not in skip:
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    yield stmt.target.id, stmt.value, f"{node.name}.{stmt.target.id}"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True))
            pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            name = getattr(node, "name", "lambda")
            for param, d in pairs:
                yield param.arg, d, f"{name}({param.arg}=…)"


def _offences() -> list[str]:
    defaults = _defaults()
    skip: dict[str, set[str]] = {}
    for path, name in SETTINGS:
        skip.setdefault(path, set()).add(name)
    found = []
    for path, tree in _modules():
        for name, expr, where in _defaults_in(tree, skip.get(path, set())):
            line = f"services/{path}:{expr.lineno} {where}"
            if _is_mirror(expr):
                found.append(f"{line} mirrors a setting ({ast.unparse(expr)}): take the settings section")
                continue
            ok, value = _literal(expr)
            if not ok or not isinstance(value, bool | int | float | str) or (path, name) in UNRELATED:
                continue
            if (owners := defaults.get(name, {}).get(_key(value))):
                found.append(f"{line} = {value!r} repeats the default of {'/'.join(sorted(set(owners)))}.{name}")
    return found


def test_the_scan_sees_the_settings_classes():
    names = {cls.__name__ for cls in SETTINGS.values()}
    assert {"RedisSettings", "TaskSettings", "LearnerSettings", "DesyncSettings", "JudgeSettings",
            "SearchR1EMParams", "LoadSettings", "WarmstartSettings"} <= names
    assert all(issubclass(c, Section | ServiceSettings) or c.__module__.endswith("reward.params")
               for c in SETTINGS.values())


def test_no_default_repeats_a_setting():
    offences = _offences()
    assert not offences, "settings defaults stated again outside their settings class:\n" + "\n".join(offences)


def test_the_scan_catches_a_repeated_default_and_a_mirror():
    tree = ast.parse("from dataclasses import dataclass\n"
                     "@dataclass\nclass Policy:\n    min_tokens: int = 64\n"
                     "def stream(*, max_deliveries: int = 3, block_ms=default(TaskSettings, 'block_ms')): ...\n")
    seen = {(name, ast.unparse(expr)) for name, expr, _ in _defaults_in(tree, set())}
    assert seen == {("min_tokens", "64"), ("max_deliveries", "3"), ("block_ms", "default(TaskSettings, 'block_ms')")}
    defaults = _defaults()
    assert _key(64) in defaults["min_tokens"] and _key(3) in defaults["max_deliveries"]
    assert _is_mirror(next(e for n, e, _ in _defaults_in(tree, set()) if n == "block_ms"))


def test_the_reward_clients_policy_is_the_settings_default():
    from searchr1.core.clients.reward import DEFAULT_RETRY
    from searchr1.rollout.settings import RewardClientSettings

    assert DEFAULT_RETRY == RewardClientSettings().retry_policy()


def test_web_search_retries_are_the_retry_settings():
    from searchr1.retriever.web.settings import WebSettings

    assert issubclass(WebSettings, RetrySettings)
    tree = ast.parse((SERVICES / "retriever/web/settings.py").read_text(encoding="utf-8"))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WebSettings").body
    own = {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert not own & {"timeout_s", "retries", "deadline_s"}, "declared by RetrySettings"


SETTINGS_COMMANDS = {("rollout", "once"): {"question", "seed", "steer"}, ("index", "build"): set()}
"""Commands whose flags map onto a settings class, and the flags that are not settings."""


@pytest.mark.parametrize("path", list(SETTINGS_COMMANDS), ids=[" ".join(p) for p in SETTINGS_COMMANDS])
def test_settings_backed_flags_leave_defaults_to_the_settings(path):
    cmd = typer.main.get_command(build_app())
    for name in path:
        cmd = cmd.commands[name]
    retyped = {p.name: p.default for p in cmd.params
               if p.name not in SETTINGS_COMMANDS[path] and p.default is not None}
    assert not retyped, f"`searchr1 {' '.join(path)}` re-types settings defaults: {retyped}"
