"""CLI commands of the learner service, registered into `searchr1` by `searchr1.cli`:
`searchr1 train --config …` (`--replay ARCHIVE_DIR` trains from an archive), `searchr1 data prepare`,
`searchr1 data fetch`, the `searchr1 archive` group (`tools/archive_commands.py`), `searchr1 audit`
(`tools/audit_commands.py`) and `searchr1 weights rollback VERSION`.

Keep this module light: Typer at import time only; heavy imports go inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from searchr1.cli import Groups


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""
    from searchr1.learner.tools.archive_commands import register_archive
    from searchr1.learner.tools.audit_commands import register_audit

    register_archive(groups.archive)
    register_audit(groups.app)
    groups.app.add_typer(_weights_app(), name="weights")

    @groups.app.command("train")
    def train(
        config: Annotated[Path | None, typer.Option("--config", "-c", help="Run config (TOML/YAML); its 'learner' table is used.")] = None,
        model: Annotated[str | None, typer.Option(help="Override learner.model.path.")] = None,
        dataset: Annotated[str | None, typer.Option(help="Override learner.dispatcher.dataset.")] = None,
        redis_url: Annotated[str | None, typer.Option("--redis", help="Override learner.redis.url.")] = None,
        run: Annotated[str | None, typer.Option(help="Override learner.redis.run (key prefix searchr1:{run}:).")] = None,
        metrics_port: Annotated[int | None, typer.Option(min=0, max=65535, help="Serve Prometheus /metrics here.")] = None,
        max_steps: Annotated[int | None, typer.Option(min=1, help="Stop after this many steps.")] = None,
        replay: Annotated[Path | None, typer.Option(help="Train from this trajectory archive (no Redis, no "
                                                    "rollout): sets learner.archive.replay_from.")] = None,
    ) -> None:
        """Train the policy with GRPO/PPO on groups from the trajectories stream (the learner service).

        Under torchrun (WORLD_SIZE > 1) it trains data-parallel with FSDP; rank 0 talks to Redis."""
        import asyncio
        import logging

        from searchr1.core.openmp import set_openmp_waits
        from searchr1.core.settings import ConfigError, load_settings
        from searchr1.learner.settings import LearnerSettings

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        overrides: dict = {}
        try:
            settings = load_settings(LearnerSettings, config)
        except (ConfigError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        if model:
            overrides["model"] = settings.model.model_copy(update={"path": model})
        if dataset:
            overrides["dispatcher"] = settings.dispatcher.model_copy(update={"dataset": dataset})
        if redis_url or run:
            update = {k: v for k, v in (("url", redis_url), ("run", run)) if v}
            overrides["redis"] = settings.redis.model_copy(update=update)
        if metrics_port is not None:
            overrides["metrics_port"] = metrics_port
        if replay is not None:
            overrides["archive"] = settings.archive.model_copy(update={"replay_from": replay})
        if overrides:
            settings = settings.model_copy(update=overrides)
        waits = set_openmp_waits(settings.openmp_wait_policy())  # before torch loads
        logging.getLogger("searchr1.learner").info("OpenMP waits: %s", waits)
        from searchr1.core.lease import LeaseHeld, LeaseLost
        from searchr1.learner.service import run_learner

        try:
            state = asyncio.run(run_learner(settings, max_steps=max_steps))
        except (LeaseHeld, LeaseLost) as exc:  # another learner runs this run: nothing was written
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(3) from None
        typer.echo(f"stopped at step {state.step} (policy version {state.version})")

    @groups.data.command("prepare")
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
            raise typer.BadParameter(str(exc)) from exc
        typer.echo(f"wrote {n} tasks to {dst}")

    @groups.data.command("fetch")
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
            raise typer.BadParameter(str(exc)) from exc
        for path, counts in ((result.train, result.train_counts), (result.test, result.test_counts)):
            if path is not None:
                detail = ", ".join(f"{k} {v}" for k, v in counts.items())
                typer.echo(f"wrote {sum(counts.values())} rows to {path} ({detail})")


def _weights_app() -> typer.Typer:
    app = typer.Typer(help="A run's announced policy weights: roll workers back to a version the learner "
                           "published.", no_args_is_help=True)

    @app.command("rollback")
    def rollback(
        version: Annotated[int, typer.Argument(min=0, help="A version the learner announced.")],
        redis_url: Annotated[str, typer.Option("--redis", help="Redis URL.")] = "redis://127.0.0.1:6379/0",
        run: Annotated[str, typer.Option(help="Run name (keys are searchr1:{run}:…).")] = "default",
    ) -> None:
        """Announce again the learner's own announcement of VERSION (same uri and digest), so rollout
        workers reload it. Only versions the learner announced can be chosen, and the snapshot must still
        exist (weights.keep). A running learner announces its next version over it: stop it first."""
        import asyncio

        from searchr1.core.streams import StreamKeys, connect
        from searchr1.core.weights import rollback as do_rollback

        async def _run():
            redis = connect(redis_url)
            try:
                return await do_rollback(redis, StreamKeys(run), version)
            finally:
                await redis.aclose()

        try:
            wv = asyncio.run(_run())
        except LookupError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"announced version {wv.version} again: {wv.uri} (sha256 {wv.sha256})")

    return app
