"""Settings base shared by every service: pydantic-settings with an env prefix per service, nested
models through `__`, `extra="forbid"`, and an optional TOML/YAML run config that env vars override.

Precedence (highest first): keyword arguments, environment variables, the run-config file, defaults.
A run config holds one table per service (`[retriever]`, `[learner]`, …); `load_settings` picks the
table named by the class's `section`. A keyword argument names a nested field with `__`, as an
environment variable does (`redis__url=…` is `ROLLOUT_REDIS__URL`); it is merged into the nested table
(the other fields keep their file or environment values) and validated with everything else.

Each field is documented once, by the docstring under it: the CLI's help texts read it
(`core.commandline.field_help`).
"""

from __future__ import annotations

import contextvars
import tomllib
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

_FILE_VALUES: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("_FILE_VALUES", default=None)

S = TypeVar("S", bound="ServiceSettings")


class ConfigError(ValueError):
    """A run config that cannot be read or does not fit the settings class."""


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Parse a TOML or YAML run config into a dict (by file suffix)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file must be .toml, .yaml or .yml: {p}")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot parse {p}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a table at the top level")
    return data


class _FileSource(PydanticBaseSettingsSource):
    """Values from the run-config file selected by `load_settings` (lowest priority above defaults)."""

    def get_field_value(self, field, field_name):  # pragma: no cover - required by the ABC, unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_VALUES.get() or {})


class Section(BaseModel):
    """Base for nested settings models: unknown keys are errors, so typos in configs fail loudly."""

    model_config = ConfigDict(extra="forbid")


class RedisSettings(Section):
    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL (redis://host:port/db). Streams and weight announcements live here."""
    run: str = Field(default="default", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """Run name: every key is prefixed `searchr1:{run}:` so runs share a server safely."""


REDIS_REPLY_TIMEOUT_S = 30.0
"""How long a Redis reply may take before the call fails as a timeout (`searchr1.streams.RedisLink`)."""


def check_block_ms(setting: str, block_ms: int) -> int:
    """`block_ms` of a blocking stream read, refused unless it is under half the Redis reply timeout: a
    read that blocks longer than the client waits for its reply times out every time."""
    limit = int(REDIS_REPLY_TIMEOUT_S * 1000 / 2)
    if block_ms >= limit:
        raise ValueError(f"{setting} = {block_ms} ms must be below {limit} ms, half the Redis reply timeout "
                         f"({REDIS_REPLY_TIMEOUT_S:g} s): a read blocking longer than the client waits for its "
                         f"reply times out every time")
    return block_ms


class AuthSettings(Section):
    """How a server that takes a bearer token treats an empty one: the `auth` table of the retriever, the
    reward service, the learner (its snapshot server) and the viewer; `searchr1.core.auth.require_token`
    applies it at start-up."""

    insecure_no_auth: bool = False
    """Serve without a token (anyone who reaches the port may call it): without this switch a server whose
    token is empty refuses to start; with it, it starts and logs a WARNING. For a private loopback demo."""


class RetrySettings(Section):
    """How a service client retries (the policy is `searchr1.core.retry`): the one declaration of these
    knobs, shared by the retriever and reward clients and their settings tables."""

    timeout_s: float = Field(default=10.0, gt=0)
    """Per-call timeout (one attempt)."""
    retries: int = Field(default=3, ge=0, le=1000)
    """Retries after a transient error (gRPC UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED; HTTP
    connection errors, timeouts, 429, 5xx)."""
    backoff_s: float = Field(default=0.1, ge=0.0, le=60.0)
    """First retry's backoff; it doubles per retry (with jitter) up to `max_backoff_s`."""
    max_backoff_s: float = Field(default=2.0, gt=0.0, le=300.0)
    """Longest wait between two attempts (the retriever client's channel also caps its reconnect backoff
    at the smaller of this and 1 s)."""
    deadline_s: float | None = Field(default=None, gt=0.0)
    """Bound on all attempts of one call together (None: only `retries` bounds them)."""

    def retry_policy(self) -> RetrySettings:
        """These knobs alone (a settings table that extends this class carries more)."""
        return RetrySettings.model_validate(self.model_dump(include=set(RetrySettings.model_fields)))


class RewardRetrySettings(RetrySettings):
    """The reward client's retry knobs: `RetrySettings` with a longer per-call timeout. The one declaration
    of its defaults, shared by the client (`core.clients.reward`, when given no policy) and the rollout
    worker's `[rollout.reward]` table."""

    timeout_s: float = Field(default=30.0, gt=0)
    """Per-call timeout (one attempt); scoring a group takes longer than a search."""


class ServiceSettings(BaseSettings):
    """Base class for one service's settings. Subclasses set `env_prefix` and `section`."""

    model_config = SettingsConfigDict(
        extra="forbid", env_nested_delimiter="__", validate_default=True, case_sensitive=False
    )
    section: ClassVar[str] = ""
    """Name of this service's table in a run config."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _FileSource(settings_cls)


def nest_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """`{"redis__url": u, "model": m}` → `{"redis": {"url": u}, "model": m}`; None values are dropped."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        *parents, leaf = key.split("__")
        node = out
        for parent in parents:
            child = node.setdefault(parent, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key!r} conflicts with the override of {parent!r}")
            node = child
        node[leaf] = value
    return out


def load_settings(cls: type[S], config: str | Path | None = None, **overrides: Any) -> S:
    """Build `cls` from an optional run config (its `cls.section` table, or the whole file if the class
    has no section), environment variables and explicit overrides (None values are ignored; `a__b`
    names field `b` of the nested table `a`, merged into it). Everything is validated together."""
    values: dict[str, Any] = {}
    if config is not None:
        data = read_config_file(config)
        values = data.get(cls.section, {}) if cls.section else data
        if not isinstance(values, dict):
            raise ConfigError(f"[{cls.section}] in {config} must be a table")
    token = _FILE_VALUES.set(values)
    try:
        return cls(**nest_overrides(overrides))
    finally:
        _FILE_VALUES.reset(token)
