"""Secure defaults: every service binds to loopback and reaches its peers on loopback unless told
otherwise (a walk over every settings class and its nested sections), and a Redis password or TLS given
in the URL reaches redis-py's connection."""

from __future__ import annotations

import importlib
import ipaddress
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from searchr1.streams import connect

SETTINGS_MODULES = ["searchr1.core.settings", "searchr1.retriever.settings", "searchr1.reward.settings",
                    "searchr1.rollout.settings", "searchr1.learner.settings", "searchr1.learner.settings_outputs",
                    "searchr1.weightsync.settings", "searchr1.launcher.settings",
                    "searchr1.world.settings"]
LOOPBACK_NAMES = {"localhost"}


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def settings_classes() -> list[type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for name in SETTINGS_MODULES:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == name:
                found[f"{name}.{obj.__name__}"] = obj
    return list(found.values())


def network_defaults(cls: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(field path, kind, default) for every host, URL and address field, nested sections included."""
    for name, info in cls.model_fields.items():
        path = f"{prefix}{name}"
        default = info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            yield from network_defaults(type(default), f"{path}.")
        elif name == "host" or name.endswith("_host"):
            yield path, "host", default
        elif (name == "url" or name.endswith("_url")) and isinstance(default, str):
            yield path, "url", default
        elif name == "addresses":
            yield path, "addresses", default


CLASSES = settings_classes()


def test_the_walk_sees_every_service():
    paths = {f"{c.__module__.split('.')[1]}:{p}" for c in CLASSES for p, _, _ in network_defaults(c)}
    for expected in ["retriever:host", "reward:host", "learner:weights.host", "rollout:metrics_host",
                     "rollout:retriever.addresses", "rollout:reward.url", "launcher:host", "core:url"]:
        assert expected in paths, sorted(paths)


@pytest.mark.parametrize("cls", CLASSES, ids=[f"{c.__module__.split('.')[1]}.{c.__name__}" for c in CLASSES])
def test_network_defaults_are_loopback(cls):
    for path, kind, default in network_defaults(cls):
        where = f"{cls.__module__}.{cls.__name__}.{path} = {default!r}"
        if default is None:  # an optional override (e.g. public_host): falls back to a loopback field
            continue
        if kind == "host":
            assert is_loopback(default), f"{where} binds beyond loopback by default"
        elif kind == "url":
            host = urlsplit(default).hostname or ""
            assert is_loopback(host), f"{where} reaches beyond loopback by default"
        else:
            for address in default:
                host = address.rsplit(":", 1)[0]
                assert is_loopback(host), f"{where} reaches beyond loopback by default"


@pytest.mark.parametrize("url, password, username, tls", [
    ("redis://:pw@127.0.0.1:6379/0", "pw", None, False),
    ("redis://alice:p%40ss@127.0.0.1:6379/2", "p@ss", "alice", False),
    ("rediss://:pw@redis.internal:6380/0", "pw", None, True),
    ("rediss://127.0.0.1:6380/0?ssl_cert_reqs=required", None, None, True),
])
async def test_redis_password_and_tls_come_from_the_url(url, password, username, tls):
    client = connect(url)
    try:
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        assert kwargs.get("password") == password and kwargs.get("username") == username
        assert issubclass(pool.connection_class, aioredis.SSLConnection) is tls
    finally:
        await client.aclose()
