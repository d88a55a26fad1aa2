"""The learner's stop grace from a config's shape (`searchr1.learner.stop_budget`), by hand: parameter
counts of the shipped models against their published sizes, the 3B GRPO step, checkpoint and snapshot, what
PPO's critic and a measured step change, and every Search-R1 config giving `searchr1 up` (its
`[launcher] grace_period_s`) at least that grace plus torchrun's exit. torchrun's own timeout: the
wrapper (`searchr1.learner.torchrun`) leaves a torch that reads it alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchr1.core.settings import load_settings
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.stop_budget import (
    StopBudgetError,
    dense_decoder_parameters,
    model_parameters,
    stop_budget,
)

ROOT = Path(__file__).resolve().parents[2]
N_3B, N_7B = 3_085_938_688, 7_615_616_512


def test_parameter_counts_by_hand():
    # Qwen2.5-3B: 151,936 × 2,048 tied embeddings; per layer q 2048², k and v 2048 × 256, o 2048², q/k/v
    # biases 2,048 + 2 × 256, MLP 3 × 2048 × 11008, two norms; 36 layers and the final norm: 3.09 B published
    layer = 2048 * 2048 * 2 + 2 * 2048 * 256 + 2048 + 512 + 3 * 2048 * 11008 + 2 * 2048
    assert model_parameters("models/Qwen2.5-3B") == 151_936 * 2048 + 36 * layer + 2048 == N_3B
    assert model_parameters("models/Qwen2.5-7B-Instruct") == N_7B  # 7.61 B published; untied LM head
    llama = {"hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 16, "num_attention_heads": 2,
             "num_key_value_heads": 1, "vocab_size": 10, "tie_word_embeddings": True}
    assert dense_decoder_parameters(llama) == 10 * 8 + (8 * 8 + 2 * 8 * 4 + 8 * 8 + 3 * 8 * 16 + 16) + 8  # no biases
    with pytest.raises(StopBudgetError, match="measured step time"):
        model_parameters("models/MyModel")


def test_the_3b_grpo_grace_by_hand():
    s = load_settings(LearnerSettings, ROOT / "configs/searchr1-3b-grpo.toml")
    b = stop_budget(s, ranks=4)
    tokens = 512 * 5 * 4608  # groups × group size × max_seq_len
    # policy forward + backward 6 N, the recomputed forward 2 N, the reference's forward 2 N, over 4 × 100 TFLOP/s
    assert b.tokens == tokens and b.step_s == pytest.approx(tokens * 10 * N_3B / 4e14)  # 910.1 s
    assert b.checkpoint_s == pytest.approx(12 * N_3B / 1e8)  # 370.3 s of fp32 weights and moments at 100 MB/s
    assert b.snapshot_s == pytest.approx(2 * N_3B / 1e8)  # 61.7 s of bf16 weights
    assert b.total_s == 1380  # 910.1 + 370.3 + 61.7 + 30 = 1372.1 s, rounded up to whole minutes
    assert "1380 s" in b.explain()


def test_ppo_checkpoints_its_critic_and_a_measured_step_replaces_the_estimate():
    s = load_settings(LearnerSettings, ROOT / "configs/searchr1-3b-ppo.toml")
    b = stop_budget(s, ranks=4)
    assert b.checkpoint_s == pytest.approx(2 * 12 * N_3B / 1e8)  # policy and critic
    measured = stop_budget(s, ranks=4, step_s=100.0)
    assert measured.step_s == 100.0 and "measured" in measured.explain()
    assert stop_budget(s, ranks=1).step_s == pytest.approx(4 * b.step_s)


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("searchr1-*.toml")))
def test_searchr1_up_gives_the_learner_its_grace(config):
    """`searchr1 up` kills a process `grace_period_s` after SIGTERM and gives its torchrun that less 10 s."""
    from searchr1.deploy.plan import deploy_plan
    from searchr1.launcher.planner import torchrun_timeout_s

    plan = deploy_plan(ROOT / "configs" / config)
    assert torchrun_timeout_s(plan.launch.grace_period_s) >= plan.grace.total_s, plan.grace.explain()


def test_the_torchrun_wrapper_leaves_a_torch_that_reads_the_timeout_alone():
    from searchr1.learner import torchrun

    pytest.importorskip("torch")
    if not torchrun.reads_shutdown_timeout():
        pytest.skip("this torch predates TORCH_ELASTIC_SHUTDOWN_TIMEOUT (tests/integration/test_learner_stop_grace.py)")
    from torch.distributed.elastic.multiprocessing import api

    close = api.PContext.close
    assert torchrun.apply_shutdown_timeout(120) is False and api.PContext.close is close
