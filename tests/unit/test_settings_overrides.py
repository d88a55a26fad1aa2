"""The one override path of every command (`load_settings(cls, config, a__b=…)`, validated with the file and
the environment), help texts read from field docstrings, and settings declared once (`RetrySettings`,
the vLLM engine config built from `EngineSettings`)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import typer
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from searchr1.core.commandline import field_help, settings_or_exit
from searchr1.core.settings import (
    ConfigError,
    RedisSettings,
    RetrySettings,
    ServiceSettings,
    load_settings,
    nest_overrides,
)
from searchr1.rollout.settings import (
    EngineSettings,
    RetrieverClientSettings,
    RewardClientSettings,
    RolloutSettings,
)


class DemoSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DEMO_")
    section: ClassVar[str] = "demo"
    port: int = Field(default=1, ge=0, le=65535)
    """Port the demo listens on."""
    redis: RedisSettings = Field(default_factory=RedisSettings)
    """Where the demo's Redis is."""


def test_nest_overrides_nests_double_underscores_and_drops_none():
    assert nest_overrides({"redis__url": "u", "redis__run": None, "port": 2, "a__b__c": 1}) == {
        "redis": {"url": "u"}, "port": 2, "a": {"b": {"c": 1}}}
    with pytest.raises(ConfigError, match="conflicts"):
        nest_overrides({"redis": "x", "redis__url": "u"})


def test_a_nested_override_merges_into_the_file_and_env_values(tmp_path, monkeypatch):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[demo]\nport = 10\n[demo.redis]\nrun = "filerun"\nurl = "redis://file:1/0"\n')
    monkeypatch.setenv("DEMO_PORT", "11")
    s = load_settings(DemoSettings, cfg, redis__url="redis://flag:2/0")
    assert (s.port, s.redis.url, s.redis.run) == (11, "redis://flag:2/0", "filerun")


def test_a_nested_override_is_validated():
    with pytest.raises(ValueError, match="run"):
        load_settings(DemoSettings, None, redis__run="no spaces allowed")
    with pytest.raises(ValueError, match="port"):
        load_settings(DemoSettings, None, port=70_000)


def test_settings_or_exit_exits_2_with_the_reason(capsys):
    with pytest.raises(typer.Exit) as e:
        settings_or_exit(DemoSettings, None, redis__nope="x")
    assert e.value.exit_code == 2 and "nope" in capsys.readouterr().err


def test_field_help_is_the_field_docstring_through_nested_models():
    # the field's own default follows its docstring (escaped for rich: it shows as [default: 1])
    assert field_help(DemoSettings, "port") == "Port the demo listens on. \\[default: 1]"
    assert field_help(DemoSettings, "redis.url").startswith("Redis URL")
    assert field_help(DemoSettings, "port", "More.") == "Port the demo listens on. More. \\[default: 1]"
    assert field_help(RolloutSettings, "retriever.timeout_s") == field_help(RetrySettings, "timeout_s")


def test_rollout_flags_reach_the_nested_tables():
    s = load_settings(RolloutSettings, None, redis__run="cli", retriever__addresses=["h:1", "h:2"],
                      reward__url="http://r:1", agent__max_turns=2, eval__group_by=["knowledge"])
    assert s.redis.run == "cli" and s.retriever.addresses == ["h:1", "h:2"] and s.reward.url == "http://r:1"
    assert s.agent.max_turns == 2 and s.eval.group_by == ["knowledge"]
    assert s.retriever.top_k == 3  # the rest of the table keeps its value


def test_retry_knobs_are_declared_once():
    knobs = set(RetrySettings.model_fields)
    assert knobs == {"timeout_s", "retries", "backoff_s", "max_backoff_s", "deadline_s"}
    for cls in (RetrieverClientSettings, RewardClientSettings):
        assert issubclass(cls, RetrySettings)
    assert RetrieverClientSettings().retry_policy() == RetrySettings()
    assert RewardClientSettings().retry_policy() == RetrySettings(timeout_s=30.0)
    policy = RetrieverClientSettings(retries=7, addresses=["x:1"]).retry_policy()
    assert type(policy) is RetrySettings and policy.retries == 7
    with pytest.raises(ValueError):
        RetrySettings(max_backoff_s=0)


def test_the_vllm_engine_config_is_built_from_engine_settings():
    from searchr1.rollout.vllm_engine import VLLM_ENGINE_FIELDS, VllmEngineConfig

    assert VLLM_ENGINE_FIELDS <= set(EngineSettings.model_fields)
    engine = EngineSettings(max_model_len=1024, dtype="float32")
    config = VllmEngineConfig(model="m", engine=engine)
    assert config.engine.model_dump(include=VLLM_ENGINE_FIELDS)["max_model_len"] == 1024


def test_the_defaults_help_shows():
    import ast

    from searchr1.core.commandline import default_text

    def text(src: str):
        return default_text(ast.parse(src, mode="eval").body)

    assert text("Field(default=4, ge=0)") == "4" and text("Field(8, ge=1)") == "8"
    assert text('Field(default_factory=lambda: ["data_source"])') == "data_source"
    assert text('Path("logs")') == "logs" and text("True") == "true" and text('"http://x:1"') == "http://x:1"
    for none in ("None", "Field(default=None)", "Field(default_factory=dict)", "Field(default_factory=list)",
                 "Field(default_factory=RedisSettings)", "Path.home() / 'x'"):
        assert text(none) is None, none
