"""Secrets hidden from process tables and tracker configs (`core/redaction.py`), on hand-written inputs."""

from __future__ import annotations

from searchr1.core.redaction import HIDDEN, redact_argv, redact_config, redact_url


def test_redact_url_hides_only_the_password():
    assert redact_url("redis://:s3cret@10.0.0.5:6379/0") == f"redis://:{HIDDEN}@10.0.0.5:6379/0"
    assert redact_url("redis://user:pw@host/1") == f"redis://user:{HIDDEN}@host/1"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"  # no password
    assert redact_url("user@example.org") == "user@example.org"  # not a URL
    assert redact_url("http://[::1") == "http://[::1"  # unparsable: left alone


def test_redact_argv_hides_url_passwords_and_secret_flag_values():
    argv = ["searchr1", "train", "--redis", "redis://:pw@h:1/0", "--token", "abc", "--api-key=xyz",
            "--run", "demo", "--max-steps", "3"]
    assert redact_argv(argv) == ["searchr1", "train", "--redis", f"redis://:{HIDDEN}@h:1/0", "--token", HIDDEN,
                                 f"--api-key={HIDDEN}", "--run", "demo", "--max-steps", "3"]
    assert redact_argv(["--tokens-per-step", "5"]) == ["--tokens-per-step", "5"]  # a name ending otherwise


def test_redact_config_walks_nested_dumps():
    dump = {"token": "t", "metrics_open": False, "redis": {"url": "redis://:pw@r:6379/0", "run": "x"},
            "weights": {"token": None, "dir": "/w"}, "web": {"api_key": "k", "api_key_env": "SERPER_API_KEY"},
            "list": [{"password": "p"}, "plain"]}
    out = redact_config(dump)
    assert out == {"token": HIDDEN, "metrics_open": False, "redis": {"url": f"redis://:{HIDDEN}@r:6379/0", "run": "x"},
                   "weights": {"token": None, "dir": "/w"}, "web": {"api_key": HIDDEN, "api_key_env": "SERPER_API_KEY"},
                   "list": [{"password": HIDDEN}, "plain"]}
    assert dump["token"] == "t", "the input is not changed"
