"""`searchr1 eval`'s pieces, importable now that the command is thin: output directories per model and
the evaluation config built from the rollout settings and the command's flags."""

from __future__ import annotations

from pathlib import Path

from searchr1.core.settings import load_settings
from searchr1.rollout.evaluation.run import EvalRequest, eval_config, output_dirs
from searchr1.rollout.settings import RolloutSettings


def _request(**kw) -> EvalRequest:
    base = dict(models=["m"], data=Path("d.jsonl"), out=Path("out"), limit=None, metric="searchr1_em", samples=2,
                temperature=0.7, greedy=True, seed=5, concurrency=3)
    return EvalRequest(**{**base, **kw})


def test_one_model_writes_into_out_several_into_a_directory_each():
    assert output_dirs(["runs/a/policy"], Path("out")) == [Path("out")]
    assert output_dirs(["x/a", "y/b"], Path("out")) == [Path("out/a"), Path("out/b")]
    assert output_dirs(["x/step", "y/step"], Path("out")) == [Path("out/0-step"), Path("out/1-step")]


def test_eval_config_takes_the_flags_sampling_and_the_settings_limits():
    settings = load_settings(RolloutSettings, None, agent__max_turns=2, agent__top_p=0.9,
                             agent__extra_args={"k": 1}, engine__max_model_len=2048,
                             eval__group_by=["data_source", "knowledge"])
    config = eval_config(settings, _request())
    assert (config.samples, config.greedy, config.concurrency) == (2, True, 3)
    s = config.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.extra_args) == (0.7, 0.9, -1, 5, {"k": 1})
    assert config.limits.max_turns == 2 and config.limits.max_context_tokens == 2048
    assert config.limits.max_tokens_per_turn == settings.agent.max_tokens_per_turn
    assert config.group_by == ("data_source", "knowledge")
