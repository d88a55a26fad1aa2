"""Settings base: file < env < overrides, nested models via __, unknown keys fail."""

from __future__ import annotations

from typing import ClassVar

import pytest
from pydantic import Field, ValidationError
from pydantic_settings import SettingsConfigDict

from searchr1.core.settings import ConfigError, RedisSettings, ServiceSettings, load_settings


class DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DEMO_")
    section: ClassVar[str] = "demo"
    port: int = Field(default=1, ge=0, le=65535)
    """Port."""
    redis: RedisSettings = RedisSettings()
    """Redis."""


def test_defaults():
    s = load_settings(DemoSettings)
    assert s.port == 1 and s.redis.run == "default"


def test_file_then_env_then_overrides(tmp_path, monkeypatch):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[demo]\nport = 10\n[demo.redis]\nrun = "filerun"\nurl = "redis://file:1/0"\n[other]\nx = 1\n')
    assert load_settings(DemoSettings, cfg).port == 10
    monkeypatch.setenv("DEMO_PORT", "20")
    monkeypatch.setenv("DEMO_REDIS__RUN", "envrun")
    s = load_settings(DemoSettings, cfg)
    assert s.port == 20 and s.redis.run == "envrun" and s.redis.url == "redis://file:1/0"
    assert load_settings(DemoSettings, cfg, port=30, redis=None).port == 30


def test_yaml(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("demo:\n  port: 7\n")
    assert load_settings(DemoSettings, cfg).port == 7


def test_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(DemoSettings, tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[demo]\nprot = 3\n")
    with pytest.raises(ValidationError, match="prot"):
        load_settings(DemoSettings, bad)
    bad.write_text("[demo]\nport = 70000\n")
    with pytest.raises(ValidationError, match="port"):
        load_settings(DemoSettings, bad)
    bad.write_text("[demo\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_settings(DemoSettings, bad)
    with pytest.raises(ValidationError):
        RedisSettings(run="has space")


def test_blocking_reads_must_stay_under_the_redis_reply_timeout():
    """A read that blocks as long as the client waits for Redis's reply times out every time: refused."""
    from pydantic import ValidationError

    from searchr1.learner.settings import LearnerSettings
    from searchr1.rollout.settings import RolloutSettings

    for build in (lambda ms: RolloutSettings(tasks={"block_ms": ms}), lambda ms: LearnerSettings(read_block_ms=ms)):
        build(14_999)
        for ms in (15_000, 30_000, 60_000):
            with pytest.raises(ValidationError, match="half the Redis reply timeout"):
                build(ms)
