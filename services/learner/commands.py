"""CLI commands of the learner service, registered into `searchr1` by `searchr1.cli`:
`searchr1 train --config …` (`--replay ARCHIVE_DIR` trains from an archive, `--check` only checks the Redis
budget), `searchr1 data prepare`, `searchr1 data fetch`, the `searchr1 archive` group
(`tools/archive_commands.py`), `searchr1 audit` (`tools/audit_commands.py`) and `searchr1 weights rollback VERSION`.

Each command parses its flags and calls the learner's own functions; `train` loads `LearnerSettings`
through the one validated override path (`core.commandline.settings_or_exit`), its flags' help texts are
the settings fields' docstrings. Keep this module light: heavy imports happen inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from searchr1.core.commandline import (
    EXIT_FAILED,
    EXIT_HELD,
    EXIT_USAGE,
    INSECURE_HELP,
    RUN_DIR_HELP,
    error,
    fail,
    field_help,
    model_dir_or_exit,
    redis_failure,
    redis_target,
    settings_or_exit,
    token_or_exit,
)

if TYPE_CHECKING:
    from searchr1.cli import Groups
    from searchr1.learner.settings import LearnerSettings

LEARNER_SETTINGS = "searchr1.learner.settings:LearnerSettings"


SIGNALLED_EXIT = 143
"""`searchr1 train`'s exit code when SIGTERM/SIGINT stopped it before its last step (128 + SIGTERM): it has
checkpointed, and a supervisor (a Kubernetes Job, torchrun) that restarts failed processes starts it again
to resume. Exit 0 means the run is done."""


def run_train(settings: LearnerSettings, max_steps: int | None) -> int:
    """Train until `max_steps` (or the configured total) under the OpenMP wait policy the settings ask for;
    returns the exit code: 0 at the last step, `SIGNALLED_EXIT` when a signal stopped it earlier."""
    import asyncio
    import logging

    from searchr1.core.faults import faults_from_env
    from searchr1.core.openmp import set_openmp_waits
    from searchr1.core.supervise import TaskDied

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    waits = set_openmp_waits(settings.openmp_wait_policy())  # before torch loads
    logging.getLogger("searchr1.learner").info("OpenMP waits: %s", waits)
    from redis.exceptions import RedisError

    from searchr1.core.tracking import TrackerUnavailable
    from searchr1.learner.process import run_learner
    from searchr1.learner.redis_budget import RedisBudgetError
    from searchr1.learner.tools.data import DatasetError
    from searchr1.streams import LeaseHeld, LeaseLost

    stop = asyncio.Event()  # set by SIGTERM/SIGINT (run_learner installs the handlers)
    try:
        state = asyncio.run(run_learner(settings, stop, max_steps=max_steps,
                                        faults=faults_from_env()))  # armed only by the fault suite
    except RedisError as exc:  # Redis never answered at start (a lost connection later is ridden out)
        redis_failure(settings.redis.url, exc, "is Redis running, and is [learner.redis] url (--redis) its URL?")
    except (LeaseHeld, LeaseLost) as exc:  # another learner runs this run: nothing was written
        return error(str(exc), EXIT_HELD)
    except RedisBudgetError as exc:  # the run's settings, not a fault: nothing was written
        return error(str(exc), EXIT_USAGE)
    except DatasetError as exc:  # a row the wire refuses, named: nothing was dispatched
        return error(str(exc), EXIT_USAGE)
    except TrackerUnavailable as exc:  # a tracker the config asks for is not installed
        return error(str(exc), EXIT_USAGE)
    except TaskDied as exc:  # the dispatcher, the lease keeper or the watchdog ended the run, named: restart
        if isinstance(exc.cause, LeaseLost):
            return error(str(exc), 3)
        return error(str(exc), 1)
    typer.echo(f"stopped at step {state.step} (policy version {state.version})")
    last = max_steps if max_steps is not None else settings.optim.total_steps
    if stop.is_set() and state.step < last:
        typer.echo(f"stopped by a signal before step {last}: exit {SIGNALLED_EXIT} (resume from the checkpoint)",
                   err=True)
        return SIGNALLED_EXIT
    return 0


def run_check(settings: LearnerSettings) -> int:
    """`searchr1 train --check`: the start-up check of what Redis must hold (`redis_budget`) against the run's
    Redis, and nothing else; returns 0 when it fits, 2 with the message naming the settings when not."""
    import asyncio

    from redis.exceptions import RedisError

    from searchr1.learner.redis_budget import RedisBudgetError, enforce_redis_budget
    from searchr1.streams import connect

    async def check():
        redis = connect(settings.redis.url)
        try:
            return await enforce_redis_budget(settings, redis)
        finally:
            await redis.aclose()

    try:
        budget = asyncio.run(check())
    except RedisBudgetError as exc:
        return error(str(exc), EXIT_USAGE)
    except (OSError, RedisError) as exc:
        return error(f"cannot read Redis' maxmemory: {exc}", EXIT_FAILED)
    limit = f"{budget.maxmemory / 2**30:.2f} GiB" if budget.maxmemory else "no limit"
    typer.echo(f"Redis holds what this run keeps unacked: {budget.held_groups} groups × "
               f"{budget.bytes_per_group / 2**20:.2f} MiB = {budget.need_bytes / 2**30:.2f} GiB, maxmemory {limit}")
    return 0


def train(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Run config (TOML/YAML); its 'learner' "
                                                "table is used.")] = None,
    model: Annotated[str | None, typer.Option(help=field_help(LEARNER_SETTINGS, "model.path"))] = None,
    dataset: Annotated[str | None, typer.Option(help=field_help(LEARNER_SETTINGS, "dispatcher.dataset"))] = None,
    redis_url: Annotated[str | None, typer.Option("--redis", help=field_help(LEARNER_SETTINGS, "redis.url"))] = None,
    run: Annotated[str | None, typer.Option(help=field_help(LEARNER_SETTINGS, "redis.run"))] = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help=field_help(LEARNER_SETTINGS, "metrics_port"))] = None,
    max_steps: Annotated[int | None, typer.Option(min=1, help="Stop after this many steps.")] = None,
    replay: Annotated[Path | None, typer.Option(help=field_help(LEARNER_SETTINGS, "archive.replay_from"))] = None,
    insecure_no_auth: Annotated[bool | None, typer.Option(
        "--insecure-no-auth", help=INSECURE_HELP + " (The snapshot server of weights.http.)")] = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Only check that the run's Redis can hold what the run keeps unacked, and exit: 0 when it "
        "can, 2 naming the settings when not (the compose projects' learner-check runs it before the learner).")]
    = False,
) -> None:
    """Train the policy with GRPO/PPO on groups from the trajectories stream (the learner service).

    Under torchrun (WORLD_SIZE > 1) it trains data-parallel with FSDP; rank 0 talks to Redis."""
    from searchr1.learner.settings import LearnerSettings

    settings = settings_or_exit(
        LearnerSettings, config, model__path=model, dispatcher__dataset=dataset, redis__url=redis_url,
        redis__run=run, metrics_port=metrics_port, archive__replay_from=replay,
        auth__insecure_no_auth=insecure_no_auth)
    if check:
        raise typer.Exit(run_check(settings))
    if settings.weights.http:
        token_or_exit(settings.weights.token, settings.auth, server="the learner's snapshot server",
                      setting="LEARNER_WEIGHTS__TOKEN ([learner.weights] token)")
    model_dir_or_exit(settings.model.path, "learner.model.path")
    raise typer.Exit(run_train(settings, max_steps))


def prepare(
    src: Annotated[Path, typer.Argument(help="Search-R1 parquet (e.g. data/nq_search/train.parquet) or JSONL.")],
    dst: Annotated[Path, typer.Argument(help="Output tasks JSONL.")],
) -> None:
    """Convert a Search-R1 parquet into searchr1 tasks JSONL (question, golden_answers, data_source)."""
    from searchr1.learner.tools.data import DatasetError
    from searchr1.learner.tools.data import prepare as _prepare

    try:
        n = _prepare(src, dst)
    except DatasetError as exc:
        fail(str(exc))
    typer.echo(f"wrote {n} tasks to {dst}")


def fetch(
    out: Annotated[Path, typer.Argument(help="Directory for train.parquet and test.parquet.")],
    template: Annotated[str, typer.Option(help="base | instruct (the same rows; see searchr1.learner.tools.fetch).")]
    = "base",
    train_sources: Annotated[str, typer.Option(help="Comma-separated FlashRAG configs for train.parquet "
                                               "('' to skip).")] = "nq,hotpotqa",
    test_sources: Annotated[str, typer.Option(help="Comma-separated FlashRAG configs for test.parquet "
                                              "('' to skip).")]
    = "nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle",
    repo: Annotated[str, typer.Option(help="Hub dataset repository, or a local copy of it.")]
    = "RUC-NLPIR/FlashRAG_datasets",
    revision: Annotated[str | None, typer.Option(help="Hub revision (branch, tag or commit).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="datasets cache directory.")] = None,
) -> None:
    """Build Search-R1's train/test parquet (nq+hotpotqa; the 7 evaluation sets) from the FlashRAG datasets."""
    from searchr1.learner.tools.data import DatasetError
    from searchr1.learner.tools.fetch import fetch_search_r1_data

    def names(text: str) -> list[str]:
        return [n.strip() for n in text.split(",") if n.strip()]

    try:
        result = fetch_search_r1_data(out, train_sources=names(train_sources), test_sources=names(test_sources),
                                      repo=repo, template=template, revision=revision,
                                      cache_dir=str(cache_dir) if cache_dir else None)
    except (DatasetError, ValueError) as exc:
        fail(str(exc))
    for path, counts in ((result.train, result.train_counts), (result.test, result.test_counts)):
        if path is not None:
            detail = ", ".join(f"{k} {v}" for k, v in counts.items())
            typer.echo(f"wrote {sum(counts.values())} rows to {path} ({detail})")


async def _rollback(redis_url: str, run: str, version: int):
    from searchr1.streams import StreamKeys, connect
    from searchr1.weightsync import rollback

    redis = connect(redis_url)
    try:
        return await rollback(redis, StreamKeys(run), version)
    finally:
        await redis.aclose()


def weights_rollback(
    version: Annotated[int, typer.Argument(min=0, help="A version the learner announced.")],
    redis_url: Annotated[str | None, typer.Option(
        "--redis", help=field_help(LEARNER_SETTINGS, "redis.url", "With --run-dir: that run's."))] = None,
    run: Annotated[str | None, typer.Option(help=field_help(LEARNER_SETTINGS, "redis.run", "With --run-dir: that run's."))]
    = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help=RUN_DIR_HELP)] = None,
) -> None:
    """Announce again the learner's own announcement of VERSION (same uri and digest), so rollout workers
    reload it. Only versions the learner announced can be chosen, and the snapshot must still exist
    (weights.keep). A running learner announces its next version over it: stop it first."""
    import asyncio

    from redis.exceptions import RedisError

    url, run_name = redis_target(redis_url, run, run_dir)
    try:
        wv = asyncio.run(_rollback(url, run_name, version))
    except LookupError as exc:
        fail(str(exc), 1)
    except (RedisError, OSError) as exc:
        redis_failure(url, exc)
    typer.echo(f"announced version {wv.version} again: {wv.uri} (sha256 {wv.sha256})")


def weights_export(
    run: Annotated[Path, typer.Argument(help="Run directory (its weights/ holds the learner's snapshots) or a "
                                             "snapshot root.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write (must be new or empty; --force).")],
    version: Annotated[int | None, typer.Option(min=0, help="Policy version to export (default: the newest).")]
    = None,
    dtype: Annotated[str, typer.Option(help="Weights dtype: auto (as published), float32, bfloat16 or float16.")]
    = "auto",
    base: Annotated[Path | None, typer.Option(
        help="Base model directory whose tokenizer and chat template go into the folder (default: \\[learner.model] "
             "path of the run config).")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="The run's config (default: the one RUN_DIR/connection.json names); gives the base "
                               "model and the training settings of the model card.")] = None,
    push_to_hub: Annotated[str | None, typer.Option(
        "--push-to-hub", help="Also upload the folder to this Hub repository (owner/name; created when missing; "
                              "HF_TOKEN authenticates).")] = None,
    hub_endpoint: Annotated[str | None, typer.Option(help="Hub URL (default: HF_ENDPOINT, else huggingface.co).")]
    = None,
    private: Annotated[bool, typer.Option("--private", help="Create the Hub repository private.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out folder.")] = False,
) -> None:
    """Export a run's snapshot as a Hugging Face model folder (transformers and vLLM load it as is):
    weights in the chosen dtype, the base model's tokenizer and chat template, generation config, and a
    model card with the run's figures and setting fingerprint; optionally push it to the Hub."""
    from rich.console import Console

    from searchr1.learner.tools.export import DTYPES, ExportError, base_model_of, export_snapshot, push_folder

    if dtype not in DTYPES:
        fail(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not run.is_dir():
        fail(f"run directory {run} not found")
    if config is None and (run / "connection.json").is_file():
        from searchr1.core.run_connection import RunConnectionError, read_connection

        try:
            named = read_connection(run).config
        except RunConnectionError as exc:
            fail(str(exc))
        config = Path(named) if named and Path(named).is_file() else None
    if config is not None and not config.is_file():
        fail(f"run config {config} not found")
    console = Console(stderr=True, highlight=False)
    try:
        if base is None:
            if config is None:
                fail("give --base DIR (the base model: tokenizer and chat template) or --config (the run config)")
            base = base_model_of(config)
        with console.status(f"verifying and exporting {run} …"):
            result = export_snapshot(run, out, base=base, version=version, dtype=dtype, config=config, force=force)
    except ExportError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {out}: {exc}", EXIT_FAILED)
    typer.echo(f"exported version {result.version} ({result.dtype}) to {out}: {', '.join(result.files)}")
    if push_to_hub:
        with console.status(f"uploading {out} to {push_to_hub} …"):
            try:
                url = push_folder(out, push_to_hub, endpoint=hub_endpoint, private=private)
            except Exception as exc:  # noqa: BLE001 - huggingface_hub raises many kinds; each is one line here
                fail(f"push to {push_to_hub} failed: {type(exc).__name__}: {exc}", EXIT_FAILED)
        typer.echo(f"pushed to {push_to_hub}: {url}")


def weights_app() -> typer.Typer:
    """The `searchr1 weights` group."""
    app = typer.Typer(help="A run's policy weights: roll workers back to a version the learner published, or "
                           "export a version as a Hugging Face model folder (and push it to the Hub).",
                      no_args_is_help=True)
    app.command("rollback")(weights_rollback)
    app.command("export")(weights_export)
    return app


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""
    from searchr1.learner.tools.archive_commands import register_archive
    from searchr1.learner.tools.audit_commands import register_audit

    register_archive(groups.archive)
    register_audit(groups.app)
    groups.app.command("train")(train)
    groups.data.command("prepare")(prepare)
    groups.data.command("fetch")(fetch)
    groups.app.add_typer(weights_app(), name="weights")
