"""The learner's command as torchrun reads it. torchrun parses every argument after `-m searchr1.cli` with
its own argparse parser, which takes any unique prefix of one of its options as that option: `--run` is
read as `--run-path` and the learner never starts. Each place that starts the learner under torchrun —
`searchr1 up` with a `[placement]`, the Kubernetes gpu overlays, the compose GPU project — is parsed here by
torch's own parser, and the run name is checked to reach the learner by environment instead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from searchr1.core.settings import load_settings
from searchr1.launcher.planner import build_plan
from searchr1.launcher.settings import LauncherSettings
from tests.support.kustomize import container, learner, overlay

ROOT = Path(__file__).resolve().parents[2]
torch_run = pytest.importorskip("torch.distributed.run")


def torchrun_parse(argv: list[str]):
    """torch's own parse of a torchrun command line (`torchrun …`, `python -m searchr1.learner.torchrun …`
    or `python -m torch.distributed.run …`);
    SystemExit on error."""
    starts = [i for i, a in enumerate(argv) if a.endswith("torchrun") or a == "torch.distributed.run"]
    assert starts, argv
    return torch_run.get_args_parser().parse_args(argv[starts[0] + 1:])


def test_torchrun_reads_a_run_flag_as_its_own_option():
    """The hazard itself, so that this file stops guarding the day torchrun changes."""
    with pytest.raises(SystemExit):
        torchrun_parse(["torchrun", "--nproc_per_node", "2", "-m", "searchr1.cli", "train", "--run", "x"])


def test_up_with_a_placement_starts_a_learner_torchrun_can_parse(tmp_path: Path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[launcher]\nrun = "r9"\n[placement]\ngpus = 4\n[placement.rollout]\ngpus = [0, 1]\n'
                   '[placement.learner]\ngpus = [2, 3]\n')
    plan = build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run")
    (spec,) = [s for s in plan.specs if s.name == "learner"]
    args = torchrun_parse(spec.argv)
    assert args.module and args.training_script == "searchr1.cli"
    assert args.training_script_args[0] == "train" and "--run" not in args.training_script_args
    assert spec.env["LEARNER_REDIS__RUN"] == "r9"


@pytest.mark.parametrize("name", ["gpu", "gpu-7b", "gpu-7b-2node"])
def test_the_k8s_learner_command_parses_under_torchrun_and_gets_its_run(name):
    c = container(learner(overlay(name)))
    args = torchrun_parse([*c["command"], *c.get("args", [])])
    assert args.training_script == "searchr1.cli" and args.training_script_args[0] == "train"
    names = [e["name"] for e in c["env"]]
    values = {e["name"]: e.get("value") for e in c["env"]}
    # Kubernetes expands $(SEARCHR1_RUN) only from a variable defined earlier in the list
    assert values["LEARNER_REDIS__RUN"] == "$(SEARCHR1_RUN)"
    assert names.index("SEARCHR1_RUN") < names.index("LEARNER_REDIS__RUN")


def test_the_compose_gpu_learner_parses_under_torchrun(tmp_path: Path):
    import subprocess

    done = subprocess.run([sys.executable, "-m", "searchr1.cli", "deploy", "compose",
                           str(ROOT / "configs/searchr1-3b-grpo.toml")],
                          check=True, capture_output=True, text=True, timeout=120, cwd=ROOT)
    services = yaml.safe_load(done.stdout)["services"]
    (svc,) = [s for s in services.values() if "searchr1.learner.torchrun" in (s.get("entrypoint") or [])]
    args = torchrun_parse([*map(str, svc["entrypoint"]), *map(str, svc["command"])])
    assert args.training_script_args[0] == "train"
