"""Secrets kept out of what is written down: process tables, experiment-tracker configs, logs.

`redact_url` hides the password of a URL (`redis://:pw@host:6379/0` → `redis://:***@host:6379/0`);
`redact_argv` does that to every argument and hides the value after a secret-named flag (`--token X`,
`--password=X`); `redact_config` walks a settings dump and hides every value whose key names a secret
(token, password, secret, api key) and every URL's password. Pure functions: nothing is read or logged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HIDDEN = "***"
SECRET_NAME = re.compile(r"(^|[_-])(token|password|passwd|secret|api[_-]?key)s?$", re.IGNORECASE)
"""Setting keys and flag names whose values are secrets (`token`, `redis_password`, `api_key`, …)."""


def redact_url(text: str) -> str:
    """`text` with the password of a URL replaced by `***` (unchanged when it is no URL or has none)."""
    if "://" not in text or "@" not in text:
        return text
    try:
        parts = urlsplit(text)
        password = parts.password
    except ValueError:
        return text
    if not password:
        return text
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:{HIDDEN}@{host}"))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with URL passwords and the values of secret-named flags hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
            continue
        if arg.startswith("--"):
            name, eq, _ = arg[2:].partition("=")
            if SECRET_NAME.search(name):
                if eq:
                    out.append(f"--{name}={HIDDEN}")
                else:
                    out.append(arg)
                    hide_next = True
                continue
        out.append(redact_url(arg))
    return out


def redact_config(value: Any, key: str = "") -> Any:
    """A copy of a settings dump (`model_dump(mode="json")`) with secrets hidden."""
    if isinstance(value, Mapping):
        return {k: redact_config(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_config(v, key) for v in value]
    if value is not None and SECRET_NAME.search(key):
        return HIDDEN
    if isinstance(value, str):
        return redact_url(value)
    return value
