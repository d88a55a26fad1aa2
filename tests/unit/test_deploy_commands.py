"""`searchr1 deploy compose|k8s CONFIG`: the files written to stdout or `--out` (only once complete), and
every config they could not run refused the CLI's way — one line `error: …` on stderr, exit 2, no
traceback, no file left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from searchr1.cli import build_app
from tests.unit.test_cli_errors import _one_line_error

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs/searchr1-3b-grpo.toml"


def _deploy(*args: str, cwd: Path = ROOT) -> Result:
    env = {k: None for k in os.environ if k.startswith(("LEARNER_", "LAUNCHER_", "PLACEMENT_"))}
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(build_app(), ["deploy", *args], env=env)
    finally:
        os.chdir(old)


def test_compose_to_a_file_and_k8s_to_stdout(tmp_path):
    out = tmp_path / "docker-compose.gpu.yml"
    r = _deploy("compose", str(CONFIG), "--out", str(out))
    assert r.exit_code == 0 and r.stderr.strip() == f"wrote {out}", r.stderr
    assert yaml.safe_load(out.read_text())["name"] == "searchr1-3b-grpo"
    r = _deploy("k8s", str(CONFIG), "--learner-step-s", "120")
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert r.exit_code == 0 and [d["kind"] for d in docs] == ["Deployment", "Job", "Deployment"]
    grace = docs[1]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == 600 + 30  # 120 + 370.3 + 61.7 + 30 = 582 s, to whole minutes; + 30 s for torchrun
    assert "a step 120 s (measured)" in r.stdout


@pytest.mark.parametrize("case,text", [
    ("missing", "config file not found"),
    ("no placement", "[placement] places nothing"),
    ("contradiction", "[learner] device = \"cpu\" but the placement sets it to cuda"),
    ("bad value", "[placement] gpus: Input should be greater than or equal to 1"),
    ("unknown model", "pass the measured step time"),
    ("cores only", "[placement] lists no GPUs"),
])
def test_a_config_the_files_could_not_run_is_one_line(case, text, tmp_path):
    config = tmp_path / "run.toml"
    placed = ('[placement]\ngpus = 2\n[placement.rollout]\ngpus = [0]\n[placement.learner]\ngpus = [1]\n'
              '[learner.model]\npath = "models/Qwen2.5-3B"\n')
    body = {"missing": None, "no placement": "[learner]\nseed = 1\n",
            "contradiction": placed + '[learner]\ndevice = "cpu"\n', "bad value": "[placement]\ngpus = 0\n",
            "unknown model": placed.replace("models/Qwen2.5-3B", "models/Mine"),
            "cores only": ('[placement]\ncpus = 4\n[placement.rollout]\ncores = "0-1"\n[placement.learner]\n'
                           'cores = "2-3"\n[placement.retriever]\ncores_with = "rollout"\n[placement.reward]\n'
                           'cores_with = "rollout"\n[placement.redis]\ncores_with = "rollout"\n')}[case]
    if body is not None:
        config.write_text(body)
    out = tmp_path / "out.yml"
    for target in ("compose", "k8s"):
        _one_line_error(_deploy(target, str(config), "--out", str(out)), 2, text)
        assert not out.exists()


def test_compose_outside_the_repository_names_what_to_do(tmp_path):
    _one_line_error(_deploy("compose", str(CONFIG), cwd=tmp_path), 2, "run from the repository root or pass --base")
