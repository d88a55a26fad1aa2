"""The engine's context follows the model when it is left at its default (`RolloutSettings`)."""

from __future__ import annotations

import json

from searchr1.core.models import model_context_length
from searchr1.rollout.settings import EngineSettings, RolloutSettings


def model_dir(tmp_path, **config):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_the_default_context_is_capped_at_the_models(tmp_path):
    d = model_dir(tmp_path, max_position_embeddings=2048)
    assert EngineSettings().max_model_len == 4096
    assert RolloutSettings(model=str(d)).engine.max_model_len == 2048


def test_a_longer_model_keeps_the_default_and_an_explicit_value_is_kept(tmp_path):
    d = model_dir(tmp_path, max_position_embeddings=32768)
    assert RolloutSettings(model=str(d)).engine.max_model_len == 4096
    short = tmp_path / "short"
    short.mkdir()
    (short / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    explicit = RolloutSettings(model=str(short), engine=EngineSettings(max_model_len=3000))
    assert explicit.engine.max_model_len == 3000  # vLLM names the conflict when it starts


def test_the_context_a_model_declares(tmp_path):
    assert model_context_length(model_dir(tmp_path, text_config={"max_position_embeddings": 8192})) == 8192
    assert model_context_length(tmp_path / "missing") is None
    (tmp_path / "model" / "config.json").write_text("{not json")
    assert model_context_length(tmp_path / "model") is None
    assert RolloutSettings(model=str(tmp_path / "missing")).engine.max_model_len == 4096
