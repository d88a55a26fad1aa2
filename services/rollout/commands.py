"""CLI commands of the rollout service, registered into `searchr1` by `searchr1.cli`:
`searchr1 serve rollout` (a worker), `searchr1 rollout once` (one trajectory, printed for a person) and
`searchr1 eval` (a policy on a test set: EM/F1/format/search behaviour, greedy and sampled).

Keep this module light: Typer at import time only; heavy imports go inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from searchr1.core.protocol import tag_segments

if TYPE_CHECKING:
    from searchr1.cli import Groups

TAG_STYLES = {"think": "italic cyan", "search": "bold yellow", "information": "dim green",
              "answer": "bold magenta"}


def styled_segments(text: str) -> list[tuple[str, str]]:
    """Split a response into (segment, style) pairs by Search-R1 tag (untagged text: no style)."""
    return [(segment, TAG_STYLES[tag] if tag else "") for segment, tag in tag_segments(text)]


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""

    @groups.serve.command("rollout")
    def serve_rollout(
        config: Annotated[Path | None, typer.Option("--config", "-c", help="Run config (TOML/YAML), its "
                                                    "[rollout] table.")] = None,
        redis_url: Annotated[str | None, typer.Option("--redis", help="Redis URL.")] = None,
        run: Annotated[str | None, typer.Option(help="Run name (keys are searchr1:{run}:…).")] = None,
        model: Annotated[str | None, typer.Option(help="Initial policy directory (HF save_pretrained).")] = None,
        retriever: Annotated[list[str] | None, typer.Option("--retriever", help="Retriever gRPC address "
                                                            "host:port (repeat for replicas).")] = None,
        reward: Annotated[str | None, typer.Option("--reward", help="Reward service base URL.")] = None,
        metrics_port: Annotated[int | None, typer.Option(min=0, max=65535, help="/metrics port.")] = None,
        worker_id: Annotated[str | None, typer.Option(help="Consumer name (default host-pid).")] = None,
    ) -> None:
        """Run a rollout worker: tasks in, scored trajectory groups out, weights kept fresh. Ready when
        /metrics answers; SIGTERM drains (finishes, publishes and acks the tasks in flight)."""
        import asyncio
        import logging

        from searchr1.core.settings import ConfigError, load_settings
        from searchr1.rollout.engine import GeneratorDead
        from searchr1.rollout.service import serve
        from searchr1.rollout.settings import RolloutSettings

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        overrides: dict = {"model": model, "metrics_port": metrics_port, "worker_id": worker_id}
        try:
            settings = load_settings(RolloutSettings, config, **overrides)
            update: dict = {}
            if redis_url or run:
                update["redis"] = settings.redis.model_copy(update={k: v for k, v in
                                                                    (("url", redis_url), ("run", run)) if v})
            if retriever:
                update["retriever"] = settings.retriever.model_copy(update={"addresses": list(retriever)})
            if reward:
                update["reward"] = settings.reward.model_copy(update={"url": reward})
            settings = RolloutSettings.model_validate({**settings.model_dump(), **{k: v.model_dump()
                                                                                   for k, v in update.items()}})
        except (ConfigError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

        def ready(service) -> None:
            logging.getLogger("searchr1.rollout").info(
                "rollout worker %s ready: run=%s model=%s version=%d metrics=%s", service.worker.worker_id,
                settings.redis.run, settings.model, service.worker.loader.version, service.metrics_url)

        try:
            asyncio.run(serve(settings, on_ready=ready))
        except GeneratorDead as exc:
            typer.echo(f"error: {exc}; exiting for a restart (the tasks held are redelivered)", err=True)
            raise typer.Exit(1) from None
        except (OSError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None

    @groups.rollout.command("once")
    def once(
        question: Annotated[str, typer.Option(help="The question to answer.")],
        model: Annotated[str, typer.Option(help="Policy directory (HF save_pretrained).")],
        retriever: Annotated[str, typer.Option("--retriever", help="Retriever gRPC address host:port.")]
        = "127.0.0.1:50051",
        engine: Annotated[str, typer.Option(help="`vllm` or `hf` (slow fallback).")] = "vllm",
        max_turns: Annotated[int, typer.Option(min=0, max=64, help="Turns that may search.")] = 4,
        max_tokens_per_turn: Annotated[int, typer.Option(min=1, help="Token budget of one turn.")] = 500,
        temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature (0 = greedy).")] = 1.0,
        top_k: Annotated[int, typer.Option("--top-k", min=1, help="Passages per search.")] = 3,
        seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
        steer: Annotated[bool, typer.Option(help="Force the Search-R1 turn structure (for random demo "
                                                 "models; vLLM only).")] = False,
    ) -> None:
        """Sample ONE trajectory and print it colourised: think, search, information and answer."""
        import asyncio

        from rich.console import Console
        from rich.text import Text

        from searchr1.core.clients.retriever import RetrieverClient
        from searchr1.core.protocol import render_prompt
        from searchr1.rollout.agent import AgentLimits, Sampling, run_trajectory
        from searchr1.rollout.engine import HfCodec
        from searchr1.rollout.service import start_generator
        from searchr1.rollout.settings import EngineSettings

        console = Console()

        async def _run():
            settings = EngineSettings(kind=engine, gpu_memory_utilization=0.05, max_model_len=4096,
                                      logits_processors=["searchr1.rollout.steering:SearchSteering"] if steer else [])
            generator = await start_generator(model, settings)
            client = RetrieverClient([retriever])
            try:
                tokenizer = generator.tokenizer()  # type: ignore[attr-defined]
                codec = HfCodec(tokenizer)
                prompt = render_prompt(question, tokenizer)
                extra = None
                if steer:
                    from searchr1.rollout.steering import steer_args, word_tokens

                    extra = steer_args(tokenizer, max_searches=max_turns, search_tokens=word_tokens(tokenizer))

                async def search(q: str):
                    return (await client.search([q], top_k))[0]

                res = await run_trajectory(codec.encode(prompt), generator, codec, search,
                                           AgentLimits(max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn),
                                           Sampling(temperature=temperature, seed=seed, extra_args=extra), "once")
                return prompt, codec.decode(res.response_ids), res
            finally:
                await client.close()
                await generator.close()

        prompt, response, res = asyncio.run(_run())
        console.rule("prompt")
        console.print(Text(prompt, style="dim"))
        console.rule("trajectory")
        text = Text()
        for segment, style in styled_segments(response):
            text.append(segment, style=style or None)
        console.print(text)
        console.rule()
        console.print(f"finish: [bold]{res.finish_reason}[/]  turns: {res.num_turns}  searches: {res.num_searches}  "
                      f"sampled tokens: {res.generated_tokens}  environment tokens: {res.env_tokens}  "
                      f"answer: [bold magenta]{res.answer!r}[/]")

    @groups.app.command("eval")
    def eval_(
        model: Annotated[list[str] | None, typer.Option(
            help="Policy directory (HF save_pretrained); repeat to evaluate several snapshots in turn "
                 "(each into OUT/<name>/) and tabulate them.")] = None,
        data: Annotated[Path | None, typer.Option(help="Test set: Search-R1 parquet (unchanged) or our tasks "
                                                       "JSONL.")] = None,
        retriever: Annotated[list[str] | None, typer.Option("--retriever", help="Retriever gRPC address "
                                                            "host:port (repeat for replicas).")] = None,
        reward: Annotated[str | None, typer.Option("--reward", help="Reward service base URL.")] = None,
        out: Annotated[Path, typer.Option(help="Directory for eval.json and eval.md (and table.md).")]
        = Path("runs/eval"),
        limit: Annotated[int | None, typer.Option(min=1, help="Evaluate the first N questions only.")] = None,
        samples: Annotated[int, typer.Option(min=0, max=1024, help="Sampled trajectories per question "
                                                                  "(besides the greedy one).")] = 1,
        temperature: Annotated[float, typer.Option(min=0.0, help="Temperature of the sampled trajectories.")]
        = 1.0,
        greedy: Annotated[bool, typer.Option(help="Also run one greedy (temperature 0) trajectory.")] = True,
        max_turns: Annotated[int | None, typer.Option(min=0, max=64, help="Turns that may search "
                                                                          "(default: the config's).")] = None,
        config: Annotated[Path | None, typer.Option("--config", "-c", help="Run config (TOML/YAML): its rollout "
                                                    "table gives engine, agent limits, retriever and reward "
                                                    "settings.")] = None,
        seed: Annotated[int, typer.Option(help="Base seed of the sampled trajectories.")] = 0,
        concurrency: Annotated[int, typer.Option(min=1, max=4096, help="Questions in flight at once.")] = 16,
        group_by: Annotated[list[str] | None, typer.Option("--group-by", help="Break the report down by this "
                                                           "key of the questions' metadata, or data_source "
                                                           "(repeat; default: the config's eval.group_by).")]
        = None,
        table: Annotated[list[Path] | None, typer.Option(
            "--table", help="Evaluate nothing: print Search-R1's Table 3 layout of these eval.json files (or "
                            "directories holding one; repeat), one row each, and write it to OUT/table.md.")]
        = None,
        metric: Annotated[str, typer.Option(help="Score the table shows: searchr1_em (Search-R1's), em or f1.")]
        = "searchr1_em",
    ) -> None:
        """Evaluate policies on a test set, then print Search-R1's Table 3 layout.

        Every test question goes through the agent loop (greedy + K sampled) with the real retriever,
        scored by the reward service; EM/F1/format/search behaviour overall and per group (data_source and
        the configured metadata keys) is written to OUT/eval.json and OUT/eval.md (OUT/<model>/ for several
        --model). Then the table (a row per model, a column per test set, the average; greedy) is printed
        and written to OUT/table.md. With --table, only that table, from earlier eval.json files."""
        import asyncio
        import logging

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from searchr1.core.clients.retriever import RetrieverClient, RetrieverError
        from searchr1.core.clients.reward import RewardClient, RewardError
        from searchr1.core.settings import ConfigError, load_settings
        from searchr1.rollout.agent import AgentLimits
        from searchr1.rollout.batcher import SearchBatcher
        from searchr1.rollout.engine import HfCodec
        from searchr1.rollout.eval_report import (
            eval_labels,
            paper_table_markdown,
            paper_table_rich,
            read_eval,
            summary_table,
        )
        from searchr1.rollout.eval_stats import paper_table
        from searchr1.rollout.evaluate import EvalConfig, EvalDataError, evaluate, read_questions
        from searchr1.rollout.service import start_generator
        from searchr1.rollout.settings import RolloutSettings

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        console = Console()

        def tabulate(evals: list[tuple[Path, dict]]) -> None:
            try:
                t = paper_table(list(zip(eval_labels(evals), (doc for _, doc in evals))), metric)
            except ValueError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from None
            out.mkdir(parents=True, exist_ok=True)
            (out / "table.md").write_text(paper_table_markdown(t), encoding="utf-8")
            console.print(paper_table_rich(t))
            console.print(f"wrote {out / 'table.md'}")

        if table:
            if model or data:
                typer.echo("error: --table tabulates existing eval.json files; give it without --model/--data",
                           err=True)
                raise typer.Exit(2)
            try:
                evals = [(p if p.suffix == ".json" else p / "eval.json", read_eval(p)) for p in table]
            except ValueError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from None
            tabulate(evals)
            return
        if not model or data is None:
            typer.echo("error: give --model and --data (or --table with eval.json files)", err=True)
            raise typer.Exit(2)
        models = list(model)
        names = [Path(m).name or m for m in models]
        if len(set(names)) < len(names):
            names = [f"{i}-{n}" for i, n in enumerate(names)]
        outs = [out] if len(models) == 1 else [out / n for n in names]
        try:
            settings = load_settings(RolloutSettings, config, model=models[0])
            update: dict = {}
            if retriever:
                update["retriever"] = {**settings.retriever.model_dump(), "addresses": list(retriever)}
            if reward:
                update["reward"] = {**settings.reward.model_dump(), "url": reward}
            if max_turns is not None:
                update["agent"] = {**settings.agent.model_dump(), "max_turns": max_turns}
            if group_by:
                update["eval"] = {**settings.eval.model_dump(), "group_by": list(group_by)}
            settings = RolloutSettings.model_validate({**settings.model_dump(), **update})
            n_questions = len(read_questions(data, limit))
            a = settings.agent
            eval_config = EvalConfig(
                samples=samples, temperature=temperature, top_p=a.top_p, top_k=a.top_k, seed=seed, greedy=greedy,
                concurrency=concurrency, template=a.template, extra_args=dict(a.extra_args) or None,
                group_by=tuple(settings.eval.group_by),
                limits=AgentLimits(max_turns=a.max_turns, max_tokens_per_turn=a.max_tokens_per_turn,
                                   max_obs_tokens=a.max_obs_tokens, max_response_tokens=a.max_response_tokens,
                                   max_context_tokens=settings.engine.max_model_len))
        except (ConfigError, EvalDataError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

        async def _run(policy: str, out_dir: Path):
            r, w = settings.retriever, settings.reward
            client = RetrieverClient(r.addresses, token=r.token, timeout_s=r.timeout_s, retries=r.retries)
            scorer = RewardClient(w.url, token=w.token, timeout_s=w.timeout_s, retries=w.retries)
            generator = None
            try:
                if not await scorer.health():
                    raise RewardError(f"reward service at {w.url} does not answer /health")
                console.print(f"starting the {settings.engine.kind} engine on {policy} …")
                generator = await start_generator(policy, settings.engine)
                tokenizer = generator.tokenizer()  # type: ignore[attr-defined]
                batcher = SearchBatcher(client, top_k=r.top_k, max_batch=r.max_batch,
                                        max_wait_s=r.max_wait_ms / 1000.0, max_query_chars=r.max_query_chars)
                with Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                              console=console) as progress:
                    bar = progress.add_task("questions", total=n_questions)
                    return await evaluate(
                        data, out_dir, generator, HfCodec(tokenizer), tokenizer, batcher.search, scorer,
                        eval_config, limit=limit, on_question=lambda _recs: progress.advance(bar),
                        meta={"model": policy, "retriever": ",".join(r.addresses), "reward": w.url,
                              "top_k_passages": r.top_k, "engine": settings.engine.kind})
            finally:
                await client.close()
                await scorer.close()
                if generator is not None:
                    await generator.close()

        done: list[tuple[Path, dict]] = []
        for policy, out_dir in zip(models, outs, strict=True):
            try:
                result = asyncio.run(_run(policy, out_dir))
            except (OSError, RetrieverError, RewardError, EvalDataError, ValueError) as exc:
                typer.echo(f"error: {policy}: {exc}", err=True)
                raise typer.Exit(1) from None
            console.print(summary_table(result.document["summary"]))
            console.print(f"wrote {result.out_dir / 'eval.json'} and {result.out_dir / 'eval.md'} "
                          f"({len(result.records)} trajectories, {result.meta['wall_seconds']:.1f} s)")
            done.append((result.out_dir / "eval.json", result.document))
        if greedy and "data_source" in eval_config.group_by:
            tabulate(done)
