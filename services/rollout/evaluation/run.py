"""`searchr1 eval`: evaluate one or more policies on a test set through the real retriever and reward
service (each into its own directory), then print Search-R1's Table 3 layout; or, with `--table`, only
that table from earlier `eval.json` files. The scoring and reports are `evaluate.py`, `stats.py`
and `report.py`; this module runs them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from searchr1.core.commandline import EXIT_FAILED, error
from searchr1.rollout.evaluation.evaluate import EvalConfig
from searchr1.rollout.settings import RolloutSettings


@dataclass(frozen=True)
class EvalRequest:
    """What to evaluate and where to write it (the rest comes from `RolloutSettings`)."""

    models: list[str]
    data: Path
    out: Path
    limit: int | None
    metric: str
    samples: int
    temperature: float
    greedy: bool
    seed: int
    concurrency: int


def eval_config(settings: RolloutSettings, req: EvalRequest) -> EvalConfig:
    """The evaluation's config: the request's sampling, the agent settings' limits and template."""
    return EvalConfig.from_settings(settings.agent, settings.eval, seed=req.seed, temperature=req.temperature,
                                    max_context_tokens=settings.engine.max_model_len, samples=req.samples,
                                    greedy=req.greedy, concurrency=req.concurrency)


def output_dirs(models: list[str], out: Path) -> list[Path]:
    """OUT for one model; OUT/<name>/ for several (names made distinct by their index when they clash)."""
    if len(models) == 1:
        return [out]
    names = [Path(m).name or m for m in models]
    if len(set(names)) < len(names):
        names = [f"{i}-{n}" for i, n in enumerate(names)]
    return [out / n for n in names]


def tabulate(evals: list[tuple[Path, dict]], out: Path, metric: str) -> int:
    """Print Search-R1's Table 3 layout of `evals` in `metric`, then every metric's average per model; write
    OUT/table.md (the `metric` table first, then the others: EM, cover EM and F1 beside Search-R1's EM);
    returns the exit code."""
    from rich.console import Console

    from searchr1.rollout.evaluation.report import (
        averages_rich,
        eval_labels,
        paper_table_markdown,
        paper_table_rich,
    )
    from searchr1.rollout.evaluation.stats import TABLE_METRICS, paper_table

    labelled = list(zip(eval_labels(evals), (doc for _, doc in evals)))
    try:
        main = paper_table(labelled, metric)
        others = [paper_table(labelled, m) for m in TABLE_METRICS if m != metric]
    except ValueError as exc:
        return error(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    text = paper_table_markdown(main) + "".join(f"\n### {t.metric}\n\n" + paper_table_markdown(t) for t in others)
    (out / "table.md").write_text(text, encoding="utf-8")
    console = Console()
    console.print(paper_table_rich(main))
    console.print(averages_rich([main, *others]))
    console.print(f"wrote {out / 'table.md'}")
    return 0


def run_table(paths: list[Path], out: Path, metric: str) -> int:
    """`searchr1 eval --table`: the table of earlier eval.json files (or directories holding one)."""
    from searchr1.rollout.evaluation.report import read_eval

    try:
        evals = [(p if p.suffix == ".json" else p / "eval.json", read_eval(p)) for p in paths]
    except ValueError as exc:
        return error(str(exc))
    return tabulate(evals, out, metric)


async def _evaluate_one(settings: RolloutSettings, config: EvalConfig, req: EvalRequest, policy: str,
                        out_dir: Path, n_questions: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from searchr1.core.clients.http_retriever import retriever_client
    from searchr1.core.clients.reward import RewardClient
    from searchr1.rollout.batcher import SearchBatcher
    from searchr1.rollout.engine import HfCodec
    from searchr1.rollout.evaluation.evaluate import evaluate
    from searchr1.rollout.evaluation.fingerprint import model_fingerprint
    from searchr1.rollout.evaluation.preflight import check_retriever, check_reward
    from searchr1.rollout.service import start_generator

    console = Console()
    r, w = settings.retriever, settings.reward
    client = retriever_client(r.addresses, token=r.token, retry=r.retry_policy())
    scorer = RewardClient(w.url, token=w.token, retry=w.retry_policy())
    generator = None
    try:
        retriever_info = await check_retriever(client, r.top_k)
        await check_reward(scorer)
        model = await asyncio.to_thread(model_fingerprint, policy)
        console.print(f"starting the {settings.engine.kind} engine on {policy} …")
        generator = await start_generator(policy, settings.engine)
        tokenizer = generator.tokenizer()  # type: ignore[attr-defined]
        batcher = SearchBatcher(client, r)
        with Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[failed]}", style="bold red"), console=console) as progress:
            bar = progress.add_task("questions", total=n_questions, failed="")
            seen = {"failed": 0}

            def advance(recs) -> None:  # type: ignore[no-untyped-def]
                seen["failed"] += sum(1 for x in recs if x.error is not None or x.score_error is not None)
                progress.update(bar, advance=1, failed=f"{seen['failed']} failed" if seen["failed"] else "")

            return await evaluate(
                req.data, out_dir, generator, HfCodec(tokenizer), tokenizer, batcher.search, scorer,
                config, limit=req.limit, on_question=advance,
                meta={"model": policy, "retriever": ",".join(r.addresses), "reward": w.url,
                      "top_k_passages": r.top_k, "engine": settings.engine.kind,
                      "fingerprint": eval_fingerprint(settings, config, model, retriever_info)})
    finally:
        await client.close()
        await scorer.close()
        if generator is not None:
            await generator.close()


def eval_fingerprint(settings: RolloutSettings, config: EvalConfig, model: dict, retriever_info: dict) -> dict:
    """The setting fingerprint of one evaluation (`fingerprint.setting_fingerprint`)."""
    from searchr1.core.protocol import TEMPLATES
    from searchr1.rollout.evaluation.evaluate import SCORERS
    from searchr1.rollout.evaluation.fingerprint import setting_fingerprint, template_digest

    lim, smp = config.limits, config.sampling
    return setting_fingerprint(
        model=model, retriever={**retriever_info, "addresses": list(settings.retriever.addresses)},
        top_k=settings.retriever.top_k, template=config.template,
        template_sha256=template_digest(TEMPLATES.get(config.template, config.template)),
        limits={"max_turns": lim.max_turns, "max_tokens_per_turn": lim.max_tokens_per_turn,
                "max_obs_tokens": settings.agent.max_obs_tokens, "max_response_tokens": lim.max_response_tokens},
        decoding={"greedy": config.greedy, "samples": config.samples, "temperature": smp.temperature,
                  "top_p": smp.top_p, "top_k": smp.top_k, "seed": smp.seed, "engine": settings.engine.kind,
                  "dtype": settings.engine.dtype},
        metrics={k: name for k, name in SCORERS})


def run_eval(settings: RolloutSettings, req: EvalRequest) -> int:
    """Evaluate every model of `req` in turn, then tabulate them (greedy, by data source); returns the
    exit code: 2 for a test set or config it cannot use, 1 when a service or the engine fails (checked
    before the engine starts) or when the share of trajectories with a failed search or no score passes
    `eval.max_failure_rate` (the reports are written and the table printed first)."""
    import logging

    from rich.console import Console

    from searchr1.core.clients.retriever import RetrieverError
    from searchr1.core.clients.reward import RewardError
    from searchr1.rollout.evaluation.evaluate import EvalDataError, read_questions
    from searchr1.rollout.evaluation.preflight import PreflightError
    from searchr1.rollout.evaluation.report import failures, summary_table

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        n_questions = len(read_questions(req.data, req.limit))
        config = eval_config(settings, req)
    except (EvalDataError, ValueError) as exc:
        return error(str(exc))
    console = Console()
    done: list[tuple[Path, dict]] = []
    over: list[str] = []
    limit = settings.eval.max_failure_rate
    for policy, out_dir in zip(req.models, output_dirs(req.models, req.out), strict=True):
        try:
            result = asyncio.run(_evaluate_one(settings, config, req, policy, out_dir, n_questions))
        except PreflightError as exc:
            return error(str(exc), EXIT_FAILED)
        except (OSError, RetrieverError, RewardError, EvalDataError, ValueError) as exc:
            return error(f"{policy}: {exc}", EXIT_FAILED)
        summary = result.document["summary"]
        console.print(summary_table(summary))
        searches, scores, total, rate = failures(summary)
        if searches or scores:
            console.print(f"{searches} of {total} trajectories had a failed search and {scores} could not be scored "
                          f"({rate:.1%}; eval.max_failure_rate {limit:.1%}): see error and score_error in "
                          f"{result.out_dir / 'eval.json'}", style="bold red", markup=False)
        if rate > limit:
            over.append(f"{policy}: {rate:.1%} of trajectories failed")
        console.print(f"wrote {result.out_dir / 'eval.json'} and {result.out_dir / 'eval.md'} "
                      f"({len(result.records)} trajectories, {result.meta['wall_seconds']:.1f} s)")
        done.append((result.out_dir / "eval.json", result.document))
    code = 0
    if req.greedy and "data_source" in config.group_by:
        code = tabulate(done, req.out, req.metric)
    if over:
        return error(f"failed searches or scores above eval.max_failure_rate ({limit:.1%}): {'; '.join(over)}; the "
                     "numbers above do not measure the model", EXIT_FAILED)
    return code
