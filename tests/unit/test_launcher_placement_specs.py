"""`searchr1 up` follows the run config's `[placement]`: on 8, 4 and 2 GPUs each process's environment and
the learner's command come out of the launch plan exactly as `plan_placement` computes them; launcher
entries and service-table values that contradict the placement are refused; `--dry-run` prints the plan with its GPUs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchr1.core.settings import load_settings
from searchr1.launcher.placement import PlacementError, PlacementSettings, plan_placement
from searchr1.launcher.planner import build_plan
from searchr1.launcher.settings import LauncherSettings
from searchr1.launcher.specs import SECRET_ENV, dry_run_lines

LAYOUTS = {
    8: """
[placement]
gpus = 8
[placement.rollout]
gpus = [0, 1, 2, 3]
tensor_parallel_size = 2
gpu_memory_utilization = 0.7
vllm_port = 31000
[placement.learner]
gpus = [4, 5, 6]
master_port = 29611
[placement.retriever]
device = "gpu"
gpu = 7
""",
    4: """
[placement]
gpus = 4
[placement.rollout]
gpus = [0, 1]
[placement.learner]
gpus = [2, 3]
""",
    2: """
[placement]
gpus = 2
colocate = true
[placement.rollout]
gpus = [0, 1]
gpu_memory_utilization = 0.5
[placement.learner]
gpus = [0, 1]
""",
}


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    for key in [k for k in os.environ if k.startswith(("PLACEMENT_", "LAUNCHER_"))]:
        monkeypatch.delenv(key)


def _config(tmp_path: Path, placement: str, launcher: str = "") -> Path:
    (tmp_path / "index").mkdir(exist_ok=True)
    path = tmp_path / "run.toml"
    path.write_text(f'[launcher]\ncommand = ["searchr1"]\n[launcher.retriever]\nindex_dir = "{tmp_path / "index"}"\n'
                    f"{launcher}\n{placement}")
    return path


@pytest.mark.parametrize("gpus", sorted(LAYOUTS))
def test_processes_are_placed_exactly_as_plan_placement_says(gpus: int, tmp_path: Path):
    cfg = _config(tmp_path, LAYOUTS[gpus])
    expected = plan_placement(load_settings(PlacementSettings, cfg))
    plan = build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run")
    assert plan.problems == [] and plan.placement == expected
    specs = {s.name: s for s in plan.specs}
    assert [n for n in specs if n.startswith("rollout-")] == [w.name for w in expected.rollout]
    for name, where in expected.by_name().items():
        # the placement's variables, over the launcher's own defaults and nothing else changed
        assert {k: v for k, v in specs[name].env.items() if k in where.env} == where.env, name
    assert specs["learner"].env["LEARNER_WEIGHTS__DIR"] == str((tmp_path / "run" / "weights").resolve())
    learner = specs["learner"].argv
    assert learner[:len(expected.learner.command_prefix) + 3] == \
        [*expected.learner.command_prefix, "-m", "searchr1.cli", "train"]
    # processes the placement does not name keep the plain command and every GPU
    assert specs["reward"].argv[0] == "searchr1" and "CUDA_VISIBLE_DEVICES" not in specs["reward"].env
    assert all(s.argv[0] == "searchr1" for s in plan.specs if s.stage in ("rollout", "retriever"))


def test_eight_gpu_layout_values(tmp_path: Path):
    cfg = _config(tmp_path, LAYOUTS[8])
    specs = {s.name: s for s in build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run").specs}
    placed = [{k: v for k, v in s.env.items() if k not in {"ROLLOUT_WEIGHTS__DOWNLOAD_DIR", *SECRET_ENV["rollout"]}}
              for n, s in specs.items() if n.startswith("rollout-")]
    assert placed == [
        {"CUDA_VISIBLE_DEVICES": "0,1", "ROLLOUT_ENGINE__TENSOR_PARALLEL_SIZE": "2",
         "ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION": "0.7", "VLLM_PORT": "31000"},
        {"CUDA_VISIBLE_DEVICES": "2,3", "ROLLOUT_ENGINE__TENSOR_PARALLEL_SIZE": "2",
         "ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION": "0.7", "VLLM_PORT": "31100"}]
    assert specs["learner"].argv[:13] == ["python", "-m", "searchr1.learner.torchrun", "--nnodes", "1",
                                         "--nproc_per_node", "3", "--master_addr", "127.0.0.1", "--master_port", "29611",
                                         "-m", "searchr1.cli"]
    assert specs["learner"].env["CUDA_VISIBLE_DEVICES"] == "4,5,6" and specs["learner"].env["LEARNER_DEVICE"] == "cuda"
    assert specs["retriever"].env == {"RETRIEVER_TOKEN": specs["reward"].env["REWARD_TOKEN"],
                                      "CUDA_VISIBLE_DEVICES": "7", "RETRIEVER_SEARCH__DEVICE": "cuda",
                                      "RETRIEVER_SEARCH__FAISS_GPU": "false"}


def test_two_gpu_colocated_layout_values(tmp_path: Path):
    cfg = _config(tmp_path, LAYOUTS[2])
    specs = {s.name: s for s in build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run").specs}
    assert [specs[f"rollout-{i}"].env["CUDA_VISIBLE_DEVICES"] for i in (0, 1)] == ["0", "1"]
    assert specs["learner"].env["CUDA_VISIBLE_DEVICES"] == "0,1" and specs["learner"].argv[6] == "2"
    assert specs["retriever"].env["CUDA_VISIBLE_DEVICES"] == ""  # CPU: every GPU hidden


def test_without_placement_nothing_is_placed(tmp_path: Path):
    cfg = _config(tmp_path, "", "[launcher.rollout]\nworkers = 2\n")
    plan = build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run")
    assert plan.placement is None and plan.problems == []
    assert [s.name for s in plan.specs if s.stage == "rollout"] == ["rollout-0", "rollout-1"]
    assert all("CUDA_VISIBLE_DEVICES" not in s.env for s in plan.specs)
    assert next(s for s in plan.specs if s.name == "learner").argv[0] == "searchr1"


def test_a_placement_argument_wins_over_the_config(tmp_path: Path):
    cfg = _config(tmp_path, LAYOUTS[4])
    plan = build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run",
                      placement=PlacementSettings(gpus=2, rollout={"gpus": [0]}, learner={"gpus": [1]}))
    assert [s.name for s in plan.specs if s.stage == "rollout"] == ["rollout-0"]
    assert next(s for s in plan.specs if s.name == "learner").env["CUDA_VISIBLE_DEVICES"] == "1"


def test_learner_runs_under_this_interpreters_torchrun_by_default(tmp_path: Path):
    cfg = _config(tmp_path, LAYOUTS[4]).read_text().replace('command = ["searchr1"]\n', "")
    (tmp_path / "plain.toml").write_text(cfg)
    plan = build_plan(load_settings(LauncherSettings, tmp_path / "plain.toml"), tmp_path / "plain.toml",
                      tmp_path / "run")
    learner = next(s for s in plan.specs if s.name == "learner")
    assert learner.argv[:12] == [sys.executable, "-m", "searchr1.learner.torchrun", "--nnodes", "1",
                                 "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", "29500", "-m"]
    assert learner.argv[12:14] == ["searchr1.cli", "train"] and plan.problems == []


def test_matching_launcher_entries_pass(tmp_path: Path):
    cfg = _config(tmp_path, LAYOUTS[4], """
[launcher.rollout]
workers = 2
env = { CUDA_VISIBLE_DEVICES = "{worker_index}", VLLM_CPU_KVCACHE_SPACE = "4" }
[launcher.commands]
learner = ["python", "-m", "searchr1.learner.torchrun", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", "29500", "-m", "searchr1.cli"]
""")
    plan = build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run")
    assert plan.problems == []
    assert next(s for s in plan.specs if s.name == "rollout-1").env["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_contradicting_launcher_entries_are_problems(tmp_path: Path):
    cfg = _config(tmp_path, LAYOUTS[4], """
[launcher.rollout]
workers = 3
env = { CUDA_VISIBLE_DEVICES = "5" }
[launcher.learner]
env = { LEARNER_DEVICE = "cpu" }
[launcher.commands]
learner = ["torchrun", "--nproc_per_node", "8", "-m", "searchr1.cli"]
""")
    problems = build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run").problems
    assert any(p.startswith("rollout: [launcher.rollout] workers = 3") and "makes 2" in p for p in problems)
    assert any(p.startswith("rollout-0: its launcher env sets CUDA_VISIBLE_DEVICES='5'") for p in problems)
    assert any(p.startswith("learner: its launcher env sets LEARNER_DEVICE='cpu'") for p in problems)
    assert any(p.startswith("learner: [launcher.commands] learner") for p in problems)


def test_service_tables_that_contradict_the_placement_are_problems(tmp_path: Path):
    """The placement decides a worker's memory fraction, the learner's device and where FAISS runs: a service
    table saying otherwise would be overridden without a word, so it is refused; one that agrees passes."""
    agreeing = _config(tmp_path, LAYOUTS[8] + '[rollout.engine]\ngpu_memory_utilization = 0.7\n'
                       '[learner]\ndevice = "cuda"\n[retriever.search]\ndevice = "cuda"\nfaiss_gpu = false\n')
    assert build_plan(load_settings(LauncherSettings, agreeing), agreeing, tmp_path / "run").problems == []
    cfg = _config(tmp_path, LAYOUTS[8] + '[rollout.engine]\ngpu_memory_utilization = 0.9\n'
                  '[learner]\ndevice = "cpu"\n[retriever.search]\nfaiss_gpu = true\n')
    problems = build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run").problems
    assert sorted(problems) == [
        '[learner] device = "cpu" but the placement sets it to cuda (LEARNER_DEVICE, from [placement.learner] '
        'gpus): drop the line, the placement decides it',
        "[retriever.search] faiss_gpu = true but the placement sets it to false (RETRIEVER_SEARCH__FAISS_GPU, from "
        "[placement.retriever] faiss_gpu): drop the line, the placement decides it",
        "[rollout.engine] gpu_memory_utilization = 0.9 but the placement sets it to 0.7 "
        "(ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION, from [placement.rollout] gpu_memory_utilization): drop the line, "
        "the placement decides it"]


def test_an_impossible_placement_is_a_clear_error(tmp_path: Path):
    cfg = _config(tmp_path, "[placement]\ngpus = 2\n[placement.rollout]\ngpus = [0, 1]\n[placement.learner]\ngpus = [1]\n")
    with pytest.raises(PlacementError, match=r"GPUs \[1\] are given to both"):
        build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run")


def test_dry_run_lines_show_gpus_commands_env_and_summary(tmp_path: Path):
    cfg = _config(tmp_path, LAYOUTS[8])
    lines = dry_run_lines(build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run"))
    assert "rollout-1 (rollout, GPUs: 2,3)" in lines and "learner (learner, GPUs: 4,5,6)" in lines
    assert "reward (reward, GPUs: all)" in lines and "retriever (retriever, GPUs: 7)" in lines
    assert any(line.startswith("  $ python -m searchr1.learner.torchrun --nnodes 1 --nproc_per_node 3") for line in lines)
    assert "  VLLM_PORT=31100" in lines
    assert lines[-1] == ("placement: 2 vLLM worker(s) on GPUs 0,1 | 2,3; learner: 3 FSDP rank(s) on GPUs 4,5,6; "
                         "retriever: GPU 7")


def test_up_dry_run_prints_the_paper_placement_on_any_machine():
    from searchr1.cli import build_app

    config = Path(__file__).resolve().parents[2] / "configs" / "searchr1-3b-grpo.toml"
    result = CliRunner().invoke(build_app(), ["up", "--config", str(config), "--dry-run"], env={"COLUMNS": "400"})
    out = result.output
    assert "learner (learner, GPUs: 3,4,5,6)" in out and "rollout-2 (rollout, GPUs: 2)" in out
    # no [launcher] command: torchrun on this interpreter, as every other service runs on it
    assert f"$ {sys.executable} -m searchr1.learner.torchrun --nnodes 1 --nproc_per_node 4 --master_addr 127.0.0.1 " \
           "--master_port 29500 -m searchr1.cli train" in out
    assert "retriever (retriever, GPUs: 7)" in out and "  ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION=0.85" in out
    assert "placement: 3 vLLM worker(s) on GPUs 0 | 1 | 2" in out
    # on a machine without the index the plan is still printed, and the refusal names what is missing
    assert "problem: retriever: index" in out and result.exit_code != 0


@pytest.mark.parametrize("gpus", sorted(LAYOUTS))
def test_the_learner_broadcasts_to_every_worker_of_the_plan(gpus: int, tmp_path: Path):
    """A `broadcast` weight transport's group is the learner plus every rollout worker `searchr1 up` starts."""
    cfg = _config(tmp_path, LAYOUTS[gpus])
    specs = {s.name: s for s in build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run").specs}
    workers = sum(n.startswith("rollout-") for n in specs)
    assert specs["learner"].env["LEARNER_WEIGHTS__BROADCAST__RECEIVERS"] == str(workers)


def test_each_worker_keeps_its_weight_copies_under_the_run_directory(tmp_path: Path):
    cfg = _config(tmp_path, LAYOUTS[8])
    specs = {s.name: s for s in build_plan(load_settings(LauncherSettings, cfg), cfg, tmp_path / "run").specs}
    run = (tmp_path / "run").resolve()
    for name in ("rollout-0", "rollout-1"):
        assert specs[name].env["ROLLOUT_WEIGHTS__DOWNLOAD_DIR"] == str(run / "rollout-weights" / name)
