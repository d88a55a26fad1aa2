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


def _failing_run(out: Path, failed: int):
    """What `_evaluate_one` returns for 4 greedy trajectories of which `failed` had a failed search."""
    from searchr1.rollout.evaluation.evaluate import EvalRecord, EvalRun
    from searchr1.rollout.evaluation.report import write_outputs

    records = [EvalRecord(qid=f"q{i}", mode="greedy", sample=0, data_source="nq", question="q", golden_answers=["a"],
                          response="r", answer=None, finish_reason="error" if i < failed else "answer", num_turns=1,
                          num_searches=1, response_tokens=3, generated_tokens=3, em=0.0, cover_em=0.0, f1=0.0,
                          searchr1_em=0.0, format_valid=0.0,
                          error="search failed: UNAUTHENTICATED" if i < failed else None) for i in range(4)]
    doc = write_outputs(out, [r.to_json() for r in records], {"max_turns": 4}, ("data_source",))
    return EvalRun(records, doc, out, {"wall_seconds": 1.0})


def test_failures_above_the_threshold_exit_1_after_the_reports(tmp_path, monkeypatch, capsys):
    import searchr1.rollout.evaluation.run as run_mod
    from searchr1.rollout.evaluation.run import run_eval

    data = tmp_path / "d.jsonl"
    data.write_text('{"task_id": "t", "question": "q", "golden_answers": ["a"]}\n')
    for failed, limit, code in ((1, 0.0, 1), (1, 0.25, 0), (2, 0.25, 1), (0, 0.0, 0)):
        async def fake(settings, config, req, policy, out_dir, n, failed=failed):
            return _failing_run(out_dir, failed)

        monkeypatch.setattr(run_mod, "_evaluate_one", fake)
        settings = load_settings(RolloutSettings, None, eval__max_failure_rate=limit)
        out = tmp_path / f"out-{failed}-{limit}"
        assert run_eval(settings, _request(data=data, out=out, samples=0)) == code
        err = capsys.readouterr().err
        assert (out / "eval.json").is_file() and (out / "table.md").is_file()  # written either way
        if code:
            assert err.startswith("error: failed searches or scores above eval.max_failure_rate") and f"{failed / 4:.1%}" in err
        else:
            assert err == ""
