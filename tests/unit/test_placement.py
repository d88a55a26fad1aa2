"""Placement on 8, 4 and 2 GPUs: CUDA_VISIBLE_DEVICES per process, the learner's torchrun prefix, the vLLM
settings overrides; and the errors for GPUs out of range, repeated, shared, or not divisible by TP."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from searchr1.core.settings import load_settings
from searchr1.launcher.placement import PlacementError, PlacementSettings, plan_placement
from searchr1.learner.settings import LearnerSettings
from searchr1.retriever.settings import RetrieverSettings
from searchr1.rollout.settings import RolloutSettings


def _plan(**kw):
    return plan_placement(PlacementSettings(**kw))


def test_eight_gpus_four_vllm_tp1_four_fsdp_retriever_on_cpu():
    p = _plan(gpus=8, rollout={"gpus": [0, 1, 2, 3], "gpu_memory_utilization": 0.85, "vllm_port": 31000},
              learner={"gpus": [4, 5, 6, 7], "master_port": 29600})
    assert [w.name for w in p.rollout] == ["rollout-0", "rollout-1", "rollout-2", "rollout-3"]
    assert [w.cuda_visible_devices for w in p.rollout] == ["0", "1", "2", "3"]
    assert p.rollout[2].env == {"CUDA_VISIBLE_DEVICES": "2", "ROLLOUT_ENGINE__TENSOR_PARALLEL_SIZE": "1",
                                "ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION": "0.85", "VLLM_PORT": "31200"}
    assert p.learner.cuda_visible_devices == "4,5,6,7" and p.learner.env["LEARNER_DEVICE"] == "cuda"
    assert p.learner.command_prefix == ("python", "-m", "searchr1.learner.torchrun", "--nnodes", "1",
                                        "--nproc_per_node", "4", "--master_addr", "127.0.0.1", "--master_port", "29600")
    assert p.retriever.gpus == () and p.retriever.env == {
        "CUDA_VISIBLE_DEVICES": "", "RETRIEVER_SEARCH__DEVICE": "cpu", "RETRIEVER_SEARCH__FAISS_GPU": "false"}
    assert set(p.by_name()) == {"rollout-0", "rollout-1", "rollout-2", "rollout-3", "learner", "retriever"}


def test_eight_gpus_tp2_and_retriever_on_its_own_gpu():
    p = _plan(gpus=8, rollout={"gpus": [0, 1, 2, 3], "tensor_parallel_size": 2},
              learner={"gpus": [4, 5, 6]}, retriever={"device": "gpu", "gpu": 7, "faiss_gpu": True})
    assert [(w.name, w.cuda_visible_devices) for w in p.rollout] == [("rollout-0", "0,1"), ("rollout-1", "2,3")]
    assert p.rollout[1].env["ROLLOUT_ENGINE__TENSOR_PARALLEL_SIZE"] == "2" and "VLLM_PORT" not in p.rollout[1].env
    assert p.learner.command_prefix[6] == "3" and p.learner.cuda_visible_devices == "4,5,6"
    assert p.retriever.env == {"CUDA_VISIBLE_DEVICES": "7", "RETRIEVER_SEARCH__DEVICE": "cuda",
                               "RETRIEVER_SEARCH__FAISS_GPU": "true"}


def test_eight_gpus_colocated_as_search_r1():
    p = _plan(gpus=8, colocate=True, rollout={"gpus": list(range(8)), "gpu_memory_utilization": 0.6},
              learner={"gpus": list(range(8))})
    assert len(p.rollout) == 8 and p.rollout[7].env["ROLLOUT_ENGINE__GPU_MEMORY_UTILIZATION"] == "0.6"
    assert p.learner.cuda_visible_devices == "0,1,2,3,4,5,6,7" and p.learner.command_prefix[6] == "8"


def test_four_gpus():
    p = _plan(gpus=4, rollout={"gpus": [0, 1]}, learner={"gpus": [2, 3]})
    assert [w.cuda_visible_devices for w in p.rollout] == ["0", "1"]
    assert p.learner.cuda_visible_devices == "2,3" and p.learner.command_prefix[6] == "2"


def test_two_gpus_one_each_retriever_shares_with_colocate():
    p = _plan(gpus=2, rollout={"gpus": [0]}, learner={"gpus": [1]})
    assert [w.cuda_visible_devices for w in p.rollout] == ["0"] and p.learner.cuda_visible_devices == "1"
    assert p.learner.command_prefix[6] == "1"
    with pytest.raises(PlacementError, match="retriever GPU 1 is also given"):
        _plan(gpus=2, rollout={"gpus": [0]}, learner={"gpus": [1]}, retriever={"device": "gpu", "gpu": 1})
    p = _plan(gpus=2, colocate=True, rollout={"gpus": [0], "gpu_memory_utilization": 0.5}, learner={"gpus": [1]},
              retriever={"device": "gpu", "gpu": 0})
    assert p.retriever.cuda_visible_devices == "0"


@pytest.mark.parametrize(("kw", "message"), [
    ({"gpus": 4, "rollout": {"gpus": [0, 4]}, "learner": {"gpus": [1]}}, r"rollout GPUs \[4\] are out of range.*0..3"),
    ({"gpus": 4, "rollout": {"gpus": [0]}, "learner": {"gpus": [1, 1]}}, r"learner lists GPUs \[1\] more than once"),
    ({"gpus": 4, "rollout": {"gpus": [0, 1]}, "learner": {"gpus": [1, 2]}}, r"GPUs \[1\] are given to both"),
    ({"gpus": 8, "rollout": {"gpus": [0, 1, 2], "tensor_parallel_size": 2}, "learner": {"gpus": [4]}},
     "3 rollout GPUs cannot be cut into groups of tensor_parallel_size 2"),
    ({"gpus": 2, "rollout": {"gpus": []}, "learner": {"gpus": [1]}}, "rollout.gpus is empty"),
    ({"gpus": 2, "rollout": {"gpus": [0]}, "learner": {"gpus": []}}, "learner.gpus is empty"),
    ({"gpus": 2, "colocate": True, "rollout": {"gpus": [0, 1], "gpu_memory_utilization": 0.95},
      "learner": {"gpus": [0, 1]}}, "leaves the learner no room"),
    ({"gpus": 2, "rollout": {"gpus": [0], "vllm_port": 29500}, "learner": {"gpus": [1]}},
     "vLLM port 29500 is out of range or taken by learner.master_port"),
    ({"gpus": 2, "rollout": {"gpus": [0]}, "learner": {"gpus": [1]}, "retriever": {"device": "gpu", "gpu": 5}},
     r"retriever GPUs \[5\] are out of range"),
])
def test_errors(kw, message):
    with pytest.raises(PlacementError, match=message):
        _plan(**kw)


def test_settings_validation():
    with pytest.raises(ValidationError, match="needs retriever.gpu"):
        PlacementSettings(retriever={"device": "gpu"})
    with pytest.raises(ValidationError, match="need retriever.device"):
        PlacementSettings(retriever={"gpu": 1})
    with pytest.raises(ValidationError):
        PlacementSettings(rollout={"gpus": [0], "tp": 2})  # unknown keys are errors


def test_env_overrides_reach_the_services(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The environment a placement sets is read by each service's settings, over the run config."""
    config = tmp_path / "run.toml"
    config.write_text("[rollout.engine]\ntensor_parallel_size = 1\ngpu_memory_utilization = 0.3\n"
                      "[retriever.search]\ndevice = \"cuda\"\n[learner]\ndevice = \"cpu\"\n"
                      "[placement]\ngpus = 4\n[placement.rollout]\ngpus = [0, 1]\ntensor_parallel_size = 2\n"
                      "[placement.learner]\ngpus = [2, 3]\n")
    p = plan_placement(load_settings(PlacementSettings, config))
    (worker,) = p.rollout
    for k, v in {**worker.env, **p.learner.env, **p.retriever.env}.items():
        monkeypatch.setenv(k, v)
    engine = load_settings(RolloutSettings, config).engine
    assert (engine.tensor_parallel_size, engine.gpu_memory_utilization) == (2, 0.85)
    assert load_settings(LearnerSettings, config).device == "cuda"
    assert load_settings(RetrieverSettings, config).search.device == "cpu"


def test_placement_conflicts_name_service_values_the_placement_overrides():
    from searchr1.launcher.placement import placement_conflicts

    placed = _plan(gpus=8, rollout={"gpus": [0, 1], "tensor_parallel_size": 2}, learner={"gpus": [2]},
                   retriever={"device": "gpu", "gpu": 7, "faiss_gpu": True})
    agree = {"rollout": {"engine": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.85}},
             "learner": {"device": "cuda"}, "retriever": {"search": {"device": "cuda", "faiss_gpu": True}}}
    assert placement_conflicts(agree, placed) == [] and placement_conflicts({}, placed) == []
    differ = {"rollout": {"engine": {"tensor_parallel_size": 1}}, "retriever": {"search": {"faiss_gpu": False}}}
    assert [c.split(" but ")[0] for c in placement_conflicts(differ, placed)] == [
        "[rollout.engine] tensor_parallel_size = 1", "[retriever.search] faiss_gpu = false"]  # once per setting
