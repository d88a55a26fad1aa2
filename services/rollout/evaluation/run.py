"""`searchr1 eval`: evaluate one or more policies on a test set through the real retriever and reward
service (each into its own directory), then print Search-R1's Table 3 layout; or, with `--table`, only
that table from earlier `eval.json` files. The scoring and reports are `evaluate.py`, `stats.py`
and `report.py`; this module runs them."""

from __future__ import annotations

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
    """Print Search-R1's Table 3 layout of `evals` and write OUT/table.md; returns the exit code."""
    from rich.console import Console

    from searchr1.rollout.evaluation.report import eval_labels, paper_table_markdown, paper_table_rich
    from searchr1.rollout.evaluation.stats import paper_table

    try:
        t = paper_table(list(zip(eval_labels(evals), (doc for _, doc in evals))), metric)
    except ValueError as exc:
        return error(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(paper_table_markdown(t), encoding="utf-8")
    console = Console()
    console.print(paper_table_rich(t))
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

    from searchr1.core.clients.retriever import RetrieverClient
    from searchr1.core.clients.reward import RewardClient, RewardError
    from searchr1.rollout.batcher import SearchBatcher
    from searchr1.rollout.engine import HfCodec
    from searchr1.rollout.evaluation.evaluate import evaluate
    from searchr1.rollout.service import start_generator

    console = Console()
    r, w = settings.retriever, settings.reward
    client = RetrieverClient(r.addresses, token=r.token, retry=r.retry_policy())
    scorer = RewardClient(w.url, token=w.token, retry=w.retry_policy())
    generator = None
    try:
        if not await scorer.health():
            raise RewardError(f"reward service at {w.url} does not answer /healthz")
        console.print(f"starting the {settings.engine.kind} engine on {policy} …")
        generator = await start_generator(policy, settings.engine)
        tokenizer = generator.tokenizer()  # type: ignore[attr-defined]
        batcher = SearchBatcher(client, r)
        with Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            bar = progress.add_task("questions", total=n_questions)
            return await evaluate(
                req.data, out_dir, generator, HfCodec(tokenizer), tokenizer, batcher.search, scorer,
                config, limit=req.limit, on_question=lambda _recs: progress.advance(bar),
                meta={"model": policy, "retriever": ",".join(r.addresses), "reward": w.url,
                      "top_k_passages": r.top_k, "engine": settings.engine.kind})
    finally:
        await client.close()
        await scorer.close()
        if generator is not None:
            await generator.close()


def run_eval(settings: RolloutSettings, req: EvalRequest) -> int:
    """Evaluate every model of `req` in turn, then tabulate them (greedy, by data source); returns the
    exit code: 2 for a test set or config it cannot use, 1 when a service or the engine fails."""
    import asyncio
    import logging

    from rich.console import Console

    from searchr1.core.clients.retriever import RetrieverError
    from searchr1.core.clients.reward import RewardError
    from searchr1.rollout.evaluation.evaluate import EvalDataError, read_questions
    from searchr1.rollout.evaluation.report import summary_table

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        n_questions = len(read_questions(req.data, req.limit))
        config = eval_config(settings, req)
    except (EvalDataError, ValueError) as exc:
        return error(str(exc))
    console = Console()
    done: list[tuple[Path, dict]] = []
    for policy, out_dir in zip(req.models, output_dirs(req.models, req.out), strict=True):
        try:
            result = asyncio.run(_evaluate_one(settings, config, req, policy, out_dir, n_questions))
        except (OSError, RetrieverError, RewardError, EvalDataError, ValueError) as exc:
            return error(f"{policy}: {exc}", EXIT_FAILED)
        console.print(summary_table(result.document["summary"]))
        console.print(f"wrote {result.out_dir / 'eval.json'} and {result.out_dir / 'eval.md'} "
                      f"({len(result.records)} trajectories, {result.meta['wall_seconds']:.1f} s)")
        done.append((result.out_dir / "eval.json", result.document))
    if req.greedy and "data_source" in config.group_by:
        return tabulate(done, req.out, req.metric)
    return 0
