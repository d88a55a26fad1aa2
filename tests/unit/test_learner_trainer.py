"""Batch layout, the trainer's loss normalisation and checkpoint round trips, on a tiny random Qwen2."""

from __future__ import annotations

import math
import random

import pytest
import torch

from searchr1.core.schemas import Task, Trajectory, TrajectoryGroup
from searchr1.learner.algo.batch import build_batch, micro_batches, shard_rows
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.build import build_training
from searchr1.learner.train.checkpoint import Checkpointer, TrainState
from searchr1.learner.train.model import DistInfo, forward_logprobs
from searchr1.learner.train.optim import lr_lambda
from tests.support.synthetic import synthetic_group, tiny_qwen2

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("m") / "tiny", vocab=128, hidden=64)


def _settings(model_path, **over):
    base = {"model": {"path": str(model_path)}, "device": "cpu",
                "algorithm": {"advantage": "grpo", "use_kl_loss": True, "kl_loss_coef": 0.1, "entropy_coef": 0.01},
                "optim": {"lr": 1e-3, "weight_decay": 0.0}, "batch": {"micro_batch_size": 16}}
    base.update(over)
    return LearnerSettings(**base)


def _groups(n=3, version=0):
    rng = random.Random(1)
    return [synthetic_group(f"g{i}", group_size=4, vocab=128, rng=rng, policy_version=version) for i in range(n)]


def _traj(prompt, resp, mask, reward=1.0):
    return Trajectory(prompt_ids=prompt, response_ids=resp, loss_mask=mask,
                      behavior_logprobs=[-0.5 if m else 0.0 for m in mask], reward=reward)


def test_batch_layout_aligns_with_next_token_targets():
    g = TrajectoryGroup(task=Task(task_id="t", question="q?"), policy_version=3, sampling_temperature=1.0,
                        worker_id="w", trajectories=[
        _traj([5, 6, 7], [8, 9, 10], [1, 0, 1], reward=1.0),
        _traj([5, 6, 7], [11], [1], reward=0.0),
    ])
    b = build_batch([g], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 10], [5, 6, 7, 11, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0]]
    # column j concerns target input_ids[:, j+1]: responses start at column p-1 = 2
    assert b.loss_mask.tolist() == [[0, 0, 1, 0, 1], [0, 0, 1, 0, 0]]
    assert b.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 0, 0]]
    assert b.behavior_logprobs[0].tolist() == [0, 0, -0.5, 0, -0.5]
    assert b.token_rewards.tolist() == [[0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0]]
    assert b.policy_version.tolist() == [3, 3] and b.group_index.tolist() == [0, 0]
    assert b.num_loss_tokens == 3
    mb = b.select([1])
    assert mb.input_ids.shape == (1, 4) and mb.loss_mask.shape == (1, 3)


def test_batch_truncation_drops_cut_tokens_from_the_loss():
    g = TrajectoryGroup(task=Task(task_id="t", question="q?"), policy_version=0, sampling_temperature=1.0,
                        worker_id="w",
                        trajectories=[_traj([1, 2], [3, 4, 5, 6], [1, 1, 1, 1])])
    b = build_batch([g], max_seq_len=4)
    assert b.input_ids.tolist() == [[1, 2, 3, 4]]
    assert b.loss_mask.tolist() == [[0, 1, 1]]
    assert b.token_rewards.tolist() == [[0, 0, 1.0]]


def test_shard_rows_cover_everything_once():
    rows = [r for rank in range(3) for r in shard_rows(10, rank, 3)]
    assert rows == list(range(10))


def test_warmup_schedule_matches_verl_constant_with_warmup():
    f = lr_lambda(10, 4, "constant", 0.0)
    assert [f(s) for s in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_lambda(10, 0, "constant", 0.0)(0) == 1.0 and lr_lambda(10, 0, "constant", 0.0)(50) == 1.0


def test_decaying_schedules_by_hand():
    # cosine over the 8 steps after a 2-step warm-up, floor 0.1: 0.1 + 0.9 * (1 + cos(pi * k / 8)) / 2
    f = lr_lambda(10, 2, "cosine", 0.1)
    assert [f(s) for s in (0, 1)] == [0.0, 0.5]
    assert f(2) == pytest.approx(1.0)
    assert f(4) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)  # 0.868198
    assert f(6) == pytest.approx(0.55)  # half-way: the mean of peak and floor
    assert f(10) == pytest.approx(0.1) and f(25) == pytest.approx(0.1)  # past total_steps: the floor
    g = lr_lambda(5, 0, "linear", 0.0)
    assert [g(s) for s in range(7)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.0, 0.0])
    with pytest.raises(ValueError, match="unknown lr schedule"):
        lr_lambda(5, 0, "step", 0.0)


def test_schedule_steps_once_per_training_step_whatever_the_mini_batches(model_path):
    """veRL counts the warm-up and decay in training steps: two mini-batches (two AdamW updates) in one
    step must not advance the schedule twice."""
    s = _settings(model_path, optim={"lr": 1e-3, "weight_decay": 0.0, "total_steps": 4, "lr_schedule": "linear"},
                  batch={"micro_batch_size": 16, "mini_batches": 2})
    trainer = build_training(s, DistInfo()).trainer
    lrs = [trainer.train_step(build_batch(_groups(2)), version=0)["lr"] for _ in range(3)]
    assert lrs == pytest.approx([1e-3, 0.75e-3, 0.5e-3])
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.25e-3)  # what step 4 will use


def test_forward_logprobs_are_log_softmax_of_targets(model_path):
    training = build_training(_settings(model_path), DistInfo())
    b = build_batch(_groups(1))
    logp, ent = forward_logprobs(training.trainer.policy, b.input_ids, b.attention_mask, entropy=True)
    logits = training.trainer.policy(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1]
    ref = torch.log_softmax(logits.float(), -1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
    assert torch.allclose(logp, ref, atol=1e-5)
    assert ent.shape == logp.shape and float(ent.detach().max()) <= math.log(128) + 1e-4


def test_masked_forward_equals_full_forward_on_masked_positions(model_path):
    training = build_training(_settings(model_path), DistInfo())
    b = build_batch(_groups(2))
    full, ent_full = forward_logprobs(training.trainer.policy, b.input_ids, b.attention_mask, entropy=True)
    part, ent_part = forward_logprobs(training.trainer.policy, b.input_ids, b.attention_mask, entropy=True,
                                      mask=b.response_mask)
    m = b.response_mask.bool()
    assert torch.allclose(part[m], full[m], atol=1e-5) and torch.allclose(ent_part[m], ent_full[m], atol=1e-5)
    assert (part[~m] == 0).all() and (ent_part[~m] == 0).all()


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_micro_batching_does_not_change_the_update(model_path, mini_batches):
    """Loss normalised over the whole step's tokens: micro-batches of 1, 5 or 16 rows give one update.
    Micro-batches are length-sorted, so with 2 mini-batches (old log-probs from the no-grad pre-pass)
    this also checks that the pre-pass puts every row's log-probs back in its place."""
    batch = build_batch(_groups())
    lengths = batch.attention_mask.sum(1).tolist()
    assert lengths != sorted(lengths, reverse=True), "rows must be unsorted for the check to mean anything"
    results = []
    for micro in (16, 5, 1):
        s = _settings(model_path, batch={"micro_batch_size": micro, "mini_batches": mini_batches})
        training = build_training(s, DistInfo())
        stats = training.trainer.train_step(batch, version=0)
        results.append((stats, _params(training.trainer.policy)))
    (s0, p0) = results[0]
    for stats, params in results[1:]:
        for key in ("loss", "pg_loss", "kl_loss", "entropy", "grad_norm"):
            assert stats[key] == pytest.approx(s0[key], rel=1e-4, abs=1e-7), key
        # 5% of lr: Adam divides by sqrt(v), so an element whose gradient is ~0 moves by a sizeable share of
        # lr on summation-order noise alone (one element moved 1.3e-5 on one CPU kind, 1% of lr elsewhere)
        assert all(torch.allclose(params[k], p0[k], atol=5e-5) for k in p0)
    assert any(not torch.equal(p0[k], v) for k, v in _params(build_training(_settings(model_path), DistInfo())
                                                            .trainer.policy).items())


@pytest.mark.parametrize("coef", [0.2, -0.2])
def test_entropy_coefficient_sign_raises_or_lowers_entropy(model_path, coef):
    """Equal rewards in every group: zero GRPO advantage, KL off, so the entropy term is the whole loss. A
    positive coefficient is a bonus (entropy rises), a negative one minimises it (a sharper policy)."""
    s = _settings(model_path, algorithm={"advantage": "grpo", "use_kl_loss": False, "entropy_coef": coef})
    trainer = build_training(s, DistInfo()).trainer
    rng = random.Random(3)
    batch = build_batch([synthetic_group(f"g{i}", group_size=4, vocab=128, rng=rng, rewards=[1.0] * 4)
                         for i in range(3)])
    entropies = [trainer.train_step(batch, version=0)["entropy"] for _ in range(4)]
    assert all(e > 0 for e in entropies), "the entropy is computed whenever the coefficient is not 0"
    diffs = [b - a for a, b in zip(entropies, entropies[1:])]
    assert all((d > 0) if coef > 0 else (d < 0) for d in diffs), entropies


def test_on_policy_first_step_has_no_clipping_and_ratio_one(model_path):
    training = build_training(_settings(model_path), DistInfo())
    stats = training.trainer.train_step(build_batch(_groups()), version=0)
    assert stats["clip_frac"] == 0.0 and stats["approx_kl"] == 0.0
    assert stats["kl_loss"] == pytest.approx(0.0, abs=1e-7), "policy == reference before the first update"
    assert stats["is_weight_mean"] == pytest.approx(1.0)


def test_ratio_extremes_are_the_learner_over_engine_extremes_on_loss_tokens(model_path):
    """`is_ratio_max` / `is_ratio_min`: the largest and smallest exp(log π_learner − log π_engine) over the
    loss tokens, taken in the update's forward (before the step's optimizer update, one micro-batch)."""
    training = build_training(_settings(model_path, batch={"micro_batch_size": 64}), DistInfo())
    batch = build_batch(_groups())
    with torch.no_grad():
        logp, _ = forward_logprobs(training.trainer.policy, batch.input_ids, batch.attention_mask)
    mask = batch.loss_mask.bool()
    log_ratio = (logp - batch.behavior_logprobs)[mask]
    stats = training.trainer.train_step(batch, version=0)
    assert stats["is_ratio_max"] == pytest.approx(math.exp(float(log_ratio.max())), rel=1e-4)
    assert stats["is_ratio_min"] == pytest.approx(math.exp(float(log_ratio.min())), rel=1e-4)
    assert 0 < stats["is_ratio_min"] < stats["is_ratio_max"]


def test_off_policy_groups_get_truncated_importance_weights(model_path):
    training = build_training(_settings(model_path, algorithm={"advantage": "grpo", "max_staleness": 2,
                                                               "is_cap": 2.0}), DistInfo())
    stats = training.trainer.train_step(build_batch(_groups(version=0)), version=1)
    # behaviour log-probs in the synthetic groups are far below the model's (~ -log 128 = -4.85 vs -3..-7),
    # so weights differ from 1 and never exceed the cap
    assert stats["is_weight_mean"] != pytest.approx(1.0)
    assert 0 < stats["is_weight_mean"] <= 2.0


def test_ppo_step_trains_policy_and_critic(model_path):
    s = _settings(model_path, algorithm={"advantage": "gae", "use_kl_loss": False, "kl_in_reward": True},
                  batch={"micro_batch_size": 4, "mini_batches": 2})
    training = build_training(s, DistInfo())
    critic_before = _params(training.components[1].model)
    stats = training.trainer.train_step(build_batch(_groups()), version=0)
    assert {"value_loss", "value_clip_frac", "critic_grad_norm"} <= set(stats)
    assert math.isfinite(stats["loss"]) and stats["value_loss"] > 0
    after = _params(training.components[1].model)
    assert any(not torch.equal(after[k], critic_before[k]) for k in after)


def test_ppo_actor_takes_the_kl_loss_top_k_and_ema(model_path):
    """PPO with the actor's KL loss (EMA-PG's top-k reverse KL to an EMA anchor): the KL term is in the
    policy's loss (a step without it gives another update), the in-reward penalty stays off, and the
    anchor moves after the step."""
    algo = {"advantage": "gae", "use_kl_loss": True, "kl_loss_coef": 1.0, "kl_in_reward": False,
            "kl_loss_type": "full_reverse", "kl_topk_tokens": 8, "ref_ema_tau": 0.5, "ref_ema_period": 1}
    s = _settings(model_path, algorithm=algo, batch={"micro_batch_size": 4, "mini_batches": 2})
    torch.manual_seed(0)
    with_kl = build_training(s, DistInfo())
    ref_before = _params(with_kl.trainer.reference)
    stats = with_kl.trainer.train_step(build_batch(_groups()), version=0)
    assert stats["kl_loss"] != 0.0 and math.isfinite(stats["kl_loss"])
    after = _params(with_kl.trainer.reference)
    assert any(not torch.equal(after[k], ref_before[k]) for k in after)  # the EMA anchor moved

    no_kl = {**algo, "use_kl_loss": False, "ref_ema_tau": 1.0, "kl_topk_tokens": 0, "kl_loss_type": "low_var_kl"}
    torch.manual_seed(0)
    without = build_training(_settings(model_path, algorithm=no_kl, batch={"micro_batch_size": 4, "mini_batches": 2}),
                             DistInfo())
    assert without.trainer.reference is None
    other = without.trainer.train_step(build_batch(_groups()), version=0)
    assert other["kl_loss"] == 0.0
    pa, pb = _params(with_kl.trainer.policy), _params(without.trainer.policy)
    assert any(not torch.allclose(pa[k], pb[k]) for k in pa)


def test_ppo_refuses_two_kl_terms():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="choose one KL term for PPO"):
        LearnerSettings(algorithm={"advantage": "gae", "use_kl_loss": True, "kl_in_reward": True})


def test_checkpoint_round_trip_restores_everything(model_path, tmp_path):
    s = _settings(model_path)
    a = build_training(s, DistInfo())
    a.trainer.train_step(build_batch(_groups()), version=0)
    ck = Checkpointer(tmp_path / "ck", keep=1)
    torch.manual_seed(123)
    random.seed(5)
    ck.save(TrainState(step=1, version=1, consumed={"x", "y"}, dispatcher={"epoch": 2, "cursor": 7}), a.components)
    expect_rand = torch.rand(3)
    expect_py = random.random()

    b = build_training(s, DistInfo())
    state = ck.load(b.components)
    assert state.step == 1 and state.version == 1 and state.consumed == {"x", "y"}
    assert state.dispatcher == {"epoch": 2, "cursor": 7}
    assert torch.equal(torch.rand(3), expect_rand) and random.random() == expect_py
    pa, pb = _params(a.trainer.policy), _params(b.trainer.policy)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    oa, ob = a.components[0].optimizer.state_dict(), b.components[0].optimizer.state_dict()
    assert all(torch.equal(oa["state"][i]["exp_avg"], ob["state"][i]["exp_avg"]) for i in oa["state"])
    assert b.components[0].scheduler.state_dict()["last_epoch"] == 1
    # continuing from the checkpoint equals continuing the original
    nxt = build_batch(_groups(version=1))
    sa = a.trainer.train_step(nxt, version=1)
    sb = b.trainer.train_step(nxt, version=1)
    assert sa["loss"] == pytest.approx(sb["loss"], rel=1e-6)
    # a second save prunes the first (keep=1)
    ck.save(TrainState(step=2, version=2), a.components)
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["step00000002"]


def test_micro_batches_split_and_trim():
    b = build_batch(_groups())
    parts = micro_batches(b, 5)
    assert [p.size for p in parts] == [5, 5, 2]
    assert sum(p.num_loss_tokens for p in parts) == b.num_loss_tokens


def test_lora_snapshot_is_merged_full_weights(model_path, tmp_path):
    from safetensors.torch import load_file

    from searchr1.learner.train.model import export_weights
    from searchr1.weightsync import WeightPublisher

    s = _settings(model_path, model={"path": str(model_path), "lora": {"enabled": True, "r": 4}},
                  optim={"lr": 1e-2})
    t = build_training(s, DistInfo())
    t.trainer.train_step(build_batch(_groups()), version=0)
    model, state = export_weights(t.trainer.policy, DistInfo())
    path = WeightPublisher(tmp_path / "w", keep=3).write(1, model, state)
    w = load_file(str(next(path.glob("model*.safetensors"))))
    base = load_file(str(next(model_path.glob("model*.safetensors"))))
    assert set(w) == set(base), "no lora_ or base_layer keys: workers load plain weights"
    changed = [k for k in w if not torch.equal(w[k], base[k])]
    assert changed and all("proj" in k for k in changed)


def test_gradient_checkpointing_gives_the_same_update(model_path):
    batch = build_batch(_groups(2))
    out = []
    for flag in (False, True):
        s = _settings(model_path, model={"path": str(model_path), "gradient_checkpointing": flag})
        t = build_training(s, DistInfo())
        out.append((t.trainer.train_step(batch, version=0), _params(t.trainer.policy)))
    assert out[1][0]["loss"] == pytest.approx(out[0][0]["loss"], rel=1e-5)
    assert all(torch.allclose(out[1][1][k], out[0][1][k], atol=1e-5) for k in out[0][1])


def test_step_figures_are_the_named_fields_averaged_over_mini_batches(model_path):
    """Every policy figure is reported under its field name; with two identical-size mini-batches the
    figure is their mean (sums over mini-batches divided by their count)."""
    from dataclasses import fields

    from searchr1.learner.algo.mismatch import MismatchSums
    from searchr1.learner.train.step_figures import PolicyFigures

    s = _settings(model_path, batch={"micro_batch_size": 16, "mini_batches": 2})
    stats = build_training(s, DistInfo()).trainer.train_step(build_batch(_groups(2)), version=0)
    mismatch = set(MismatchSums(tokens=1, ratio_sq=1).figures())
    assert {f.name for f in fields(PolicyFigures)} | {"grad_norm", "lr", "is_ratio_max", "is_ratio_min"} | mismatch \
        == set(stats)
    assert stats["is_weight_mean"] == pytest.approx(1.0), "on-policy rows weigh 1 in both mini-batches"
    assert stats["loss"] == pytest.approx(stats["pg_loss"] + 0.1 * stats["kl_loss"] - 0.01 * stats["entropy"],
                                          abs=1e-6)


def test_trainer_computes_outcome_advantages_from_the_scores(model_path):
    """A batch as built (no advantages) trains the same as one whose advantages are filled by hand with
    the GRPO estimator: the trainer is where they are computed."""
    from searchr1.learner.algo.advantages import outcome_advantages

    batch = build_batch(_groups(2))
    a = build_training(_settings(model_path), DistInfo()).trainer.train_step(batch, version=0)
    b = build_training(_settings(model_path), DistInfo()).trainer.train_step(
        outcome_advantages(batch, "grpo", 1e-6), version=0)
    assert a["pg_loss"] == pytest.approx(b["pg_loss"], rel=1e-6)
