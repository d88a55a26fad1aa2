"""CLI commands of the rollout service, registered into `searchr1` by `searchr1.cli`:
`searchr1 serve rollout` (a worker), `searchr1 rollout once` (one trajectory, printed for a person) and
`searchr1 eval` (a policy on a test set: EM/F1/format/search behaviour, greedy and sampled).

Each command parses its flags, loads `RolloutSettings` through the one validated override path
(`core.commandline.settings_or_exit`) and calls the run function that lives with the service
(`service.run`, `tools.once.run_once`, `evaluation.run.run_eval`). Help texts of settings-backed flags are the
settings fields' docstrings. Keep this module light: heavy imports happen inside the run functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from searchr1.core.commandline import fail, field_help, model_dir_or_exit, settings_or_exit

if TYPE_CHECKING:
    from searchr1.cli import Groups

ROLLOUT_SETTINGS = "searchr1.rollout.settings:RolloutSettings"
AGENT_SETTINGS = "searchr1.rollout.settings:AgentSettings"

ConfigOption = Annotated[Path | None, typer.Option(
    "--config", "-c", help="Run config (TOML/YAML): its rollout table gives engine, agent limits, retriever "
                           "and reward settings.")]
RetrieverOption = Annotated[list[str] | None, typer.Option(
    "--retriever", help=field_help(ROLLOUT_SETTINGS, "retriever.addresses", "Repeat the flag for several."))]
RewardOption = Annotated[str | None, typer.Option("--reward", help=field_help(ROLLOUT_SETTINGS, "reward.url"))]


RUN_SERVICES_HELP = ("A live `searchr1 up` run directory: its retriever, reward service and token come from "
                     "RUN_DIR/connection.json (--retriever and --reward win).")


def run_services(run_dir: Path | None) -> dict:
    """The retriever address, reward URL and token of the `up` run at `run_dir` as settings overrides
    (empty without one); a run directory without a usable connection file exits 2."""
    if run_dir is None:
        return {}
    from searchr1.core.run_connection import RunConnectionError, read_connection

    try:
        conn = read_connection(run_dir)
    except RunConnectionError as exc:
        fail(str(exc))
    return {"retriever": [conn.retriever] if conn.retriever else None, "reward": conn.reward or None,
            "token": conn.token or None}


def serve_rollout(
    config: ConfigOption = None,
    redis_url: Annotated[str | None, typer.Option("--redis", help=field_help(ROLLOUT_SETTINGS, "redis.url"))] = None,
    run: Annotated[str | None, typer.Option(help=field_help(ROLLOUT_SETTINGS, "redis.run"))] = None,
    model: Annotated[str | None, typer.Option(help=field_help(ROLLOUT_SETTINGS, "model"))] = None,
    retriever: RetrieverOption = None,
    reward: RewardOption = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help=field_help(ROLLOUT_SETTINGS, "metrics_port"))] = None,
    worker_id: Annotated[str | None, typer.Option(help=field_help(ROLLOUT_SETTINGS, "worker_id"))] = None,
) -> None:
    """Run a rollout worker: tasks in, scored trajectory groups out, weights kept fresh. Ready when
    /metrics answers; SIGTERM drains (finishes, publishes and acks the tasks in flight)."""
    from searchr1.rollout.settings import RolloutSettings

    settings = settings_or_exit(
        RolloutSettings, config, model=model, metrics_port=metrics_port, worker_id=worker_id,
        redis__url=redis_url, redis__run=run, retriever__addresses=retriever or None, reward__url=reward)
    model_dir_or_exit(settings.model, "rollout.model (--model)")
    from searchr1.core.faults import faults_from_env
    from searchr1.rollout.service import run as run_worker

    raise typer.Exit(run_worker(settings, faults=faults_from_env()))  # armed only by the fault suite


def once(
    question: Annotated[str, typer.Option(help="The question to answer.")],
    model: Annotated[str | None, typer.Option(help=field_help(ROLLOUT_SETTINGS, "model"))] = None,
    retriever: RetrieverOption = None,
    engine: Annotated[str | None, typer.Option(help=field_help(ROLLOUT_SETTINGS, "engine.kind"))] = None,
    max_turns: Annotated[int | None, typer.Option(min=0, max=64, help=field_help(AGENT_SETTINGS, "max_turns"))]
    = None,
    max_tokens_per_turn: Annotated[int | None, typer.Option(
        min=1, help=field_help(AGENT_SETTINGS, "max_tokens_per_turn"))] = None,
    temperature: Annotated[float | None, typer.Option(
        min=0.0, help=field_help(AGENT_SETTINGS, "temperature", "0: greedy."))] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", min=1, help=field_help(ROLLOUT_SETTINGS, "retriever.top_k"))]
    = None,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    steer: Annotated[bool, typer.Option(help="Force the Search-R1 turn structure (for random demo "
                                             "models; vLLM only).")] = False,
    config: ConfigOption = None,
) -> None:
    """Sample ONE trajectory and print it colourised: think, search, information and answer.

    Engine, agent limits, sampling and retriever come from the run config's rollout table and ROLLOUT_*
    environment variables, as for a worker; the flags override them."""
    from searchr1.rollout.settings import RolloutSettings
    from searchr1.rollout.tools.once import OnceRequest, run_once

    settings = settings_or_exit(
        RolloutSettings, config, model=model, retriever__addresses=retriever or None, retriever__top_k=top_k,
        engine__kind=engine, agent__max_turns=max_turns, agent__max_tokens_per_turn=max_tokens_per_turn,
        agent__temperature=temperature)
    if not settings.model:
        fail("give --model (or model in the run config's rollout table)")
    model_dir_or_exit(settings.model)
    raise typer.Exit(run_once(OnceRequest(question=question, settings=settings, seed=seed, steer=steer)))


def eval_(
    model: Annotated[list[str] | None, typer.Option(
        help="Policy directory (HF save_pretrained); repeat to evaluate several snapshots in turn "
             "(each into OUT/<name>/) and tabulate them.")] = None,
    data: Annotated[Path | None, typer.Option(help="Test set: Search-R1 parquet (unchanged) or our tasks "
                                                   "JSONL.")] = None,
    retriever: RetrieverOption = None,
    reward: RewardOption = None,
    out: Annotated[Path, typer.Option(help="Directory for eval.json and eval.md (and table.md).")]
    = Path("runs/eval"),
    limit: Annotated[int | None, typer.Option(min=1, help="Evaluate the first N questions only.")] = None,
    samples: Annotated[int, typer.Option(min=0, max=1024, help="Sampled trajectories per question "
                                                              "(besides the greedy one).")] = 1,
    temperature: Annotated[float, typer.Option(min=0.0, help="Temperature of the sampled trajectories.")]
    = 1.0,
    greedy: Annotated[bool, typer.Option(help="Also run one greedy (temperature 0) trajectory.")] = True,
    max_turns: Annotated[int | None, typer.Option(
        min=0, max=64, help=field_help(AGENT_SETTINGS, "max_turns", "(the run config's when not given)"))] = None,
    config: ConfigOption = None,
    seed: Annotated[int, typer.Option(help="Base seed of the sampled trajectories.")] = 0,
    concurrency: Annotated[int, typer.Option(min=1, max=4096, help="Questions in flight at once.")] = 16,
    group_by: Annotated[list[str] | None, typer.Option("--group-by", help=field_help(
        ROLLOUT_SETTINGS, "eval.group_by", "(repeat; default: the config's eval.group_by)."))] = None,
    table: Annotated[list[Path] | None, typer.Option(
        "--table", help="Evaluate nothing: print Search-R1's Table 3 layout of these eval.json files (or "
                        "directories holding one; repeat), one row each, and write it to OUT/table.md.")]
    = None,
    metric: Annotated[str, typer.Option(help="Score the table shows first: searchr1_em (Search-R1's), em, cover_em "
                                             "or f1 (table.md holds all four).")]
    = "searchr1_em",
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help=RUN_SERVICES_HELP)] = None,
    max_failure_rate: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help=field_help(ROLLOUT_SETTINGS, "eval.max_failure_rate"))] = None,
) -> None:
    """Evaluate policies on a test set, then print Search-R1's Table 3 layout.

    The retriever and the reward service are checked first (each answers, accepts the token and serves one
    real call); then every test question goes through the agent loop (greedy + K sampled) with the real
    retriever, scored by the reward service. Search-R1 EM, EM, cover EM, F1, format and search behaviour,
    overall and per group, failed searches and unscored trajectories, and the setting fingerprint go to
    OUT/eval.json and OUT/eval.md (OUT/<model>/ for several --model). Then the table (a row per model, a
    column per test set, the average, the failures, the fingerprint; greedy) is printed and written to
    OUT/table.md. Exit 1 when failures pass eval.max_failure_rate. With --table, only that table, from
    earlier eval.json files."""
    from searchr1.rollout.evaluation.run import EvalRequest, run_eval, run_table

    if table:
        if model or data:
            fail("--table tabulates existing eval.json files; give it without --model/--data")
        raise typer.Exit(run_table(list(table), out, metric))
    if not model or data is None:
        fail("give --model and --data (or --table with eval.json files)")
    if not data.is_file():
        fail(f"test set not found: {data}")
    for m in model:
        model_dir_or_exit(m)
    from searchr1.rollout.settings import RolloutSettings

    live = run_services(run_dir)
    settings = settings_or_exit(
        RolloutSettings, config, model=model[0], retriever__addresses=retriever or live.get("retriever"),
        reward__url=reward or live.get("reward"), retriever__token=live.get("token"), reward__token=live.get("token"),
        agent__max_turns=max_turns, eval__group_by=group_by or None, eval__max_failure_rate=max_failure_rate)
    raise typer.Exit(run_eval(settings, EvalRequest(
        models=list(model), data=data, out=out, limit=limit, metric=metric, samples=samples,
        temperature=temperature, greedy=greedy, seed=seed, concurrency=concurrency)))


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""
    groups.serve.command("rollout")(serve_rollout)
    groups.rollout.command("once")(once)
    groups.app.command("eval")(eval_)
