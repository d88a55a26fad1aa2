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

EXIT_USAGE = 2
"""Bad input: a config, flag or file the command cannot use."""


EXIT_FAILED = 1
"""The command ran and failed (a service it needs, an audit that found a loss)."""


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


def _field(module: str, name: str, field: str) -> tuple[str, str, str | None, list[str]]:
    """(module, class, docstring, annotation names) of `field` on class `name`, its bases included."""
    where, node = _class(module, name)
    body = node.body
    for stmt, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == field:
            doc = None
            if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                doc = " ".join(after.value.value.split())
            return where, name, doc, _names(stmt.annotation)
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
    for field in path.split("."):
        module, name, doc, annotation = _field(module, name, field)
        nested = [n for n in annotation if n[:1].isupper() and n not in _NOT_MODELS]
        if nested:
            name = nested[0]
    if not doc:
        raise KeyError(f"{settings}.{path} has no docstring")
    return help_text(f"{doc} {extra}".strip())


def help_text(text: str) -> str:
    """`text` for a Typer help string: a bracketed word (`[rollout]`, `[default 8600]`) is escaped, so rich
    markup shows it instead of taking it for a style tag and dropping it."""
    from rich.markup import escape

    return escape(text)
