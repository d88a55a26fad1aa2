"""Servers that take a bearer token refuse to start without one unless told to serve without auth
(`auth.insecure_no_auth` / `--insecure-no-auth`), and then warn; the viewer makes one for its session."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from searchr1.cli import build_app
from searchr1.core.auth import MissingToken, require_token
from searchr1.core.settings import AuthSettings, load_settings


def _env(**extra: str) -> dict[str, str]:
    """The environment without any token or auth switch a developer's shell may carry."""
    clean = {k: v for k, v in os.environ.items()
             if not k.endswith(("_TOKEN", "__INSECURE_NO_AUTH")) and not k.startswith(("RETRIEVER_", "REWARD_"))}
    return {**clean, "COLUMNS": "200", **extra}


def test_require_token_refuses_warns_or_passes():
    with pytest.raises(MissingToken, match=r"the reward service has no token: set REWARD_TOKEN .*--insecure-no-auth"):
        require_token(None, AuthSettings(), server="the reward service", setting="REWARD_TOKEN")
    with pytest.raises(MissingToken):
        require_token("", AuthSettings(), server="x", setting="X_TOKEN")  # empty is no token
    assert require_token("s3cret", AuthSettings(), server="x", setting="X_TOKEN") is None
    assert require_token("s3cret", AuthSettings(insecure_no_auth=True), server="x", setting="X_TOKEN") is None
    warning = require_token(None, AuthSettings(insecure_no_auth=True), server="x", setting="X_TOKEN")
    assert warning.startswith("x serves WITHOUT authentication") and "X_TOKEN" in warning


@pytest.mark.parametrize(("argv", "env", "setting"), [
    (["serve", "retriever", "--index", "{tmp}"], {}, "RETRIEVER_TOKEN"),
    (["serve", "reward", "--port", "0"], {}, "REWARD_TOKEN"),
    (["train", "--max-steps", "1"], {"LEARNER_WEIGHTS__HTTP": "true"}, "LEARNER_WEIGHTS__TOKEN"),
])
def test_a_server_without_a_token_exits_2_naming_the_setting(tmp_path, argv, env, setting):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    r = CliRunner().invoke(build_app(), argv, env=_env(**env))
    assert r.exit_code == 2, r.output
    assert "has no token" in r.output and setting in r.output and "--insecure-no-auth" in r.output


@pytest.mark.parametrize("command", [["serve", "retriever"], ["serve", "reward"], ["train"], ["view"]])
def test_the_switch_is_a_flag_of_every_server(command):
    r = CliRunner().invoke(build_app(), [*command, "--help"], env=_env())
    assert r.exit_code == 0 and "--insecure-no-auth" in r.output


def test_the_switch_is_one_setting_read_from_the_environment(monkeypatch):
    from searchr1.learner.settings import LearnerSettings
    from searchr1.retriever.settings import RetrieverSettings
    from searchr1.reward.settings import RewardSettings
    from searchr1.viewer.settings import ViewerSettings

    for cls, prefix in ((RetrieverSettings, "RETRIEVER"), (RewardSettings, "REWARD"), (LearnerSettings, "LEARNER"),
                        (ViewerSettings, "VIEWER")):
        monkeypatch.delenv(f"{prefix}_AUTH__INSECURE_NO_AUTH", raising=False)
        assert load_settings(cls).auth.insecure_no_auth is False
        monkeypatch.setenv(f"{prefix}_AUTH__INSECURE_NO_AUTH", "true")
        assert load_settings(cls).auth.insecure_no_auth is True


def test_the_viewer_makes_a_session_token_unless_told_not_to(capsys):
    from searchr1.viewer.commands import _session_token
    from searchr1.viewer.settings import ViewerSettings

    settings, generated = _session_token(ViewerSettings(cache_dir=None))
    assert generated and settings.token and len(settings.token) >= 24
    assert _session_token(ViewerSettings(cache_dir=None))[0].token != settings.token
    own, generated = _session_token(ViewerSettings(cache_dir=None, token="mine"))
    assert own.token == "mine" and not generated
    open_, generated = _session_token(ViewerSettings(cache_dir=None, auth={"insecure_no_auth": True}))
    assert open_.token is None and not generated
    assert "WARNING: the viewer serves WITHOUT authentication" in capsys.readouterr().err
