"""What every thin CLI command shares: settings from the run config, the environment and the flags
through the one validated path (`settings.load_settings`), errors as exit codes, and help texts read
from the settings fields' docstrings (each field documented once, in its settings class).

Typer only at import time, so `searchr1 --help` stays instant: `field_help` reads a field's docstring
from the settings module's source (parsed, never imported), and the settings classes load when a
command runs.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")

EXIT_OK = 0
"""Done: what the command was asked to do succeeded."""

EXIT_FAILED = 1
"""The command ran and failed: a service or file it needs is unreachable or refused it, a check it runs
found a problem (an audit that found a loss, an evaluation whose failed searches or scores passed its
threshold), or an unexpected error (one line; `SEARCHR1_TRACEBACK=1` shows the traceback)."""

EXIT_USAGE = 2
"""Bad input: a flag, config, setting or file the command cannot use (found before anything ran)."""

EXIT_HELD = 3
"""Another process holds what the command needs: a second learner on a run whose lease is held."""

EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (SIGINT, 128 + 2); SIGTERM is 143 (128 + 15). `searchr1 train` stopped by a signal
before its last step exits 143 after checkpointing; `searchr1 up` passes the learner's code through."""

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success"),
    (EXIT_FAILED, "ran and failed: a service or file it needs is unreachable or refused it; a check found a problem "
                  "(audit, eval over its failure threshold); an unexpected error"),
    (EXIT_USAGE, "bad input: a flag, config, setting or file it cannot use, found before anything ran"),
    (EXIT_HELD, "another process holds the run (a second learner)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); 143 for SIGTERM"),
)
"""Every exit code of `searchr1`, documented once (docs/cli.md prints this table)."""


def error(message: str, code: int = EXIT_USAGE) -> int:
    """Print `error: message` on one line to stderr and return `code`: how a run function that returns
    its exit code reports a user error (no traceback)."""
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    return code


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print `error: message` on one line to stderr and exit with `code`: the one way a command reports a
    user error (no traceback, no usage panel)."""
    raise typer.Exit(error(message, code))


def validation_message(exc: ValueError) -> str:
    """A settings error on one line: `field.path: reason` for each field pydantic refused, else the text."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return str(exc)
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or exc.title}: {e['msg']}" for e in exc.errors())


def settings_or_exit(cls: type[M], config: str | Path | None, **overrides: Any) -> M:
    """`load_settings(cls, config, **overrides)` (`a__b` names a nested field); a config or value that does
    not validate exits 2 with the reason."""
    from searchr1.core.settings import ConfigError, load_settings

    try:
        return load_settings(cls, config, **overrides)  # type: ignore[type-var]
    except (ConfigError, ValueError) as exc:
        fail(validation_message(exc))


def redis_or_exit(url: str | None, run: str | None) -> Any:
    """The `RedisSettings` a command that takes `--redis` and `--run` talks to: the flags given, the
    settings' defaults for the others; a value that does not validate exits 2 with the reason."""
    from searchr1.core.settings import RedisSettings

    given = {k: v for k, v in (("url", url), ("run", run)) if v is not None}
    try:
        return RedisSettings(**given)
    except ValueError as exc:
        fail(validation_message(exc))


def token_or_exit(token: str | None, auth: Any, *, server: str, setting: str) -> None:
    """`core.auth.require_token` for a server's start: an empty token without `auth.insecure_no_auth`
    exits 2 with what to set; with it the server starts after a WARNING on stderr."""
    from searchr1.core.auth import MissingToken, require_token

    try:
        warning = require_token(token, auth, server=server, setting=setting)
    except MissingToken as exc:
        fail(str(exc))
    if warning:
        typer.echo(f"WARNING: {warning}", err=True)


INSECURE_HELP = ("Serve without a bearer token on purpose (auth.insecure_no_auth): anyone who reaches the port "
                 "may call it. Without it, an empty token refuses to start.")


@functools.cache
def _tree(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise KeyError(f"no source for module {module}")
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8"))


def _class(module: str, name: str) -> tuple[str, ast.ClassDef]:
    """The class `name` as seen from `module`: defined there, or imported into it from another module."""
    tree = _tree(module)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for imported in ast.walk(tree):  # TYPE_CHECKING imports too
        if isinstance(imported, ast.ImportFrom) and imported.module and imported.level == 0:
            for alias in imported.names:
                if (alias.asname or alias.name) == name:
                    return _class(imported.module, alias.name)
    raise KeyError(f"class {name} not found from {module}")


def _names(annotation: ast.expr | None) -> list[str]:
    """Class names an annotation mentions (`RedisSettings`, `X | None`, `Annotated[X, …]`)."""
    return [] if annotation is None else [n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)]


def _field(module: str, name: str, field: str) -> tuple[str, str, str | None, list[str], ast.expr | None]:
    """(module, class, docstring, annotation names, default expression) of `field` on class `name`, its bases
    included."""
    where, node = _class(module, name)
    body = node.body
    for stmt, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == field:
            doc = None
            if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                doc = " ".join(after.value.value.split())
            return where, name, doc, _names(stmt.annotation), stmt.value
    for base in node.bases:
        if isinstance(base, ast.Name):
            try:
                return _field(where, base.id, field)
            except KeyError:
                continue
    raise KeyError(f"{name}.{field} not found in {where}")


_NOT_MODELS = frozenset({"Annotated", "Any", "ClassVar", "Literal", "Optional", "Path"})


def field_help(settings: str | type, path: str, extra: str = "") -> str:
    """The docstring of field `path` (dotted through nested models, e.g. `redis.url`) of the settings class
    `settings` ("module:Class", or the class), plus `extra`: a flag's help text, written once, where the
    field is declared."""
    if isinstance(settings, str):
        module, _, name = settings.partition(":")
    else:
        module, name = settings.__module__, settings.__name__
    doc: str | None = None
    value: ast.expr | None = None
    for field in path.split("."):
        module, name, doc, annotation, value = _field(module, name, field)
        nested = [n for n in annotation if n[:1].isupper() and n not in _NOT_MODELS]
        if nested:
            name = nested[0]
    if not doc:
        raise KeyError(f"{settings}.{path} has no docstring")
    shown = default_text(value)
    return help_text(f"{doc} {extra}".strip() + (f" [default: {shown}]" if shown is not None else ""))


def default_text(value: ast.expr | None) -> str | None:
    """A settings field's default as `--help` shows it (the setting's own default: a run config or its
    environment variable may set another), read from its declaration: a literal, `Field(default=…)`, a
    `default_factory` lambda's literal, `Path("…")`. None when there is none to show (None, a computed one)."""
    node = value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Field":
        keywords = {k.arg: k.value for k in node.keywords}
        if "default" in keywords:
            node = keywords["default"]
        elif node.args:
            node = node.args[0]
        else:
            factory = keywords.get("default_factory")
            if not isinstance(factory, ast.Lambda):
                return None
            node = factory.body
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path" and node.args
            and isinstance(node.args[0], ast.Constant)):
        return str(node.args[0].value)
    if node is None:
        return None
    try:
        literal = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None
    if literal is None or literal in ({}, []):
        return None
    if isinstance(literal, bool):
        return "true" if literal else "false"
    if isinstance(literal, list | tuple):
        return ", ".join(str(x) for x in literal)
    return str(literal)


def help_text(text: str) -> str:
    """`text` for a Typer help string: a bracketed word (`[rollout]`, `[default 8600]`) is escaped, so rich
    markup shows it instead of taking it for a style tag and dropping it."""
    from rich.markup import escape

    return escape(text)


# (exception class name anywhere in its MRO, module prefix) → (what it means, exit code): the errors a
# command may let escape that still have one plain reading. Matched by name, so nothing heavy is imported.
_KNOWN_ERRORS: tuple[tuple[str, str, str, int], ...] = (
    ("AuthenticationError", "redis", "Redis refused the password", EXIT_FAILED),
    ("ConnectionError", "redis", "cannot reach Redis", EXIT_FAILED),
    ("TimeoutError", "redis", "Redis did not answer in time", EXIT_FAILED),
    ("ArrowInvalid", "pyarrow", "not a readable Parquet/Arrow file", EXIT_USAGE),
    ("SafetensorError", "safetensors", "not a readable safetensors file", EXIT_USAGE),
    ("FileNotFoundError", "builtins", "not found", EXIT_USAGE),
    ("FileExistsError", "builtins", "already exists", EXIT_USAGE),
    ("IsADirectoryError", "builtins", "a directory, not a file", EXIT_USAGE),
    ("NotADirectoryError", "builtins", "not a directory", EXIT_USAGE),
    ("PermissionError", "builtins", "permission denied", EXIT_USAGE),
    ("ConnectionError", "builtins", "cannot reach a service or the network", EXIT_FAILED),
    ("TimeoutError", "builtins", "timed out", EXIT_FAILED),
)


def describe_unexpected(exc: BaseException) -> tuple[str, int]:
    """One line and an exit code for an exception no command handled: a known kind (Redis unreachable, a
    corrupt Parquet file, a missing file) in plain words, anything else as its type and message with the
    way to see the traceback."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        detail = f"{exc.filename}: {exc.strerror}"
    if type(exc).__name__ == "SafetensorError" and "while serializing" in detail:
        # a write that failed (a full disk): a fault to ride out by a restart, not a bad input
        return f"cannot write a safetensors file: {detail}", EXIT_FAILED
    for klass in type(exc).__mro__:
        for name, module, meaning, code in _KNOWN_ERRORS:
            if klass.__name__ == name and (klass.__module__ or "").split(".")[0] == module:
                return f"{meaning}: {detail}", code
    return (f"unexpected {type(exc).__name__}: {detail} (SEARCHR1_TRACEBACK=1 shows where)", EXIT_FAILED)


RUN_DIR_HELP = ("Run directory of a live `searchr1 up` run: its Redis URL (password included) and run name come "
                "from RUN_DIR/connection.json, which the launcher writes with mode 0600. --redis and --run win.")


def redis_target(redis_url: str | None, run: str | None, run_dir: Path | None) -> tuple[str, str]:
    """(Redis URL, run name) of an ops command: the flags, else the run directory's connection file, else
    `RedisSettings`' defaults (`redis_or_exit`). A run directory without a usable connection file exits 2."""
    if run_dir is not None:
        from searchr1.core.run_connection import RunConnectionError, read_connection

        try:
            conn = read_connection(run_dir)
        except RunConnectionError as exc:
            fail(str(exc))
        redis_url, run = redis_url or conn.redis_url, run or conn.run
    redis = redis_or_exit(redis_url, run)
    return redis.url, redis.run


def redis_failure(url: str, exc: BaseException, hint: str = "for a `searchr1 up` run pass --run-dir RUN_DIR") -> NoReturn:
    """Exit 1 with one line naming the Redis that failed (its password hidden) and, for a URL without a
    password, `hint` (how to point the command at a run)."""
    from searchr1.core.redaction import redact_url

    detail = " ".join(str(exc).split()).rstrip(".")
    fail(f"cannot use Redis at {redact_url(url)}: {detail}" + (f"; {hint}" if hint and "@" not in url else ""),
         EXIT_FAILED)


def model_dir_or_exit(path: str | Path, what: str = "model") -> Path:
    """`core.models.require_model_dir`, exiting 2 with its one line when `path` is no model directory."""
    from searchr1.core.models import ModelDirError, require_model_dir

    try:
        return require_model_dir(path, what)
    except ModelDirError as exc:
        fail(str(exc))
