"""What every thin CLI command shares: settings from the run config, the environment and the flags
through the one validated path (`settings.load_settings`), errors as exit codes, and help texts read
from the settings fields' docstrings (each field documented once, in its settings class).

Typer and pydantic only: command modules import this at start-up, so `searchr1 --help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn, TypeVar, get_args

import typer
from pydantic import BaseModel

from searchr1.core.settings import ConfigError, load_settings

M = TypeVar("M", bound=BaseModel)

EXIT_USAGE = 2
"""Bad input: a config, flag or file the command cannot use."""
EXIT_FAILED = 1
"""The work itself failed (a service down, an engine that died)."""


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print `error: message` to stderr and exit with `code`."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def settings_or_exit(cls: type[M], config: str | Path | None, **overrides: Any) -> M:
    """`load_settings(cls, config, **overrides)`; a config or value that does not validate exits 2 with
    the reason."""
    try:
        return load_settings(cls, config, **overrides)  # type: ignore[type-var]
    except (ConfigError, ValueError) as exc:
        fail(str(exc))


def field_help(cls: type[BaseModel], path: str, extra: str = "") -> str:
    """The docstring of field `path` (dotted through nested models, e.g. `redis.url`) of `cls`, plus
    `extra`: a flag's help text, written where the field is declared."""
    model: Any = cls
    description = None
    for name in path.split("."):
        field = model.model_fields[name]
        description = field.description
        model = next((a for a in (field.annotation, *get_args(field.annotation))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if not description:
        raise KeyError(f"{cls.__name__}.{path} has no docstring")
    return f"{description} {extra}".strip()
