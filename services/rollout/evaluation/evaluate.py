"""Evaluation of a policy on a test set (`searchr1 eval`): every question through the real agent loop
(`run_trajectory`) on one shared engine with the real retriever, once greedy (temperature 0) and K times
sampled (temperature T), scored through the reward service, aggregated per `data_source` and per the
configured group keys, written as `eval.json` (overall + per group + per-question records) and `eval.md`.

Stages, top to bottom:

    read_questions (Search-R1 parquet or our tasks JSONL, as `searchr1.core.datasets.Question`s) →
    run_eval (questions concurrently, bounded; greedy + K samples of a question concurrently; each
    question scored as soon as it finishes) → `stats.aggregate` (pure: records in → metrics table
    out) → `report.write_outputs` (eval.json, eval.md; in a thread).

Scores, all from the reward service (`searchr1.core.clients.reward.RewardClient`):
- `em` = `exact_match` on the response (ours: the last `<answer>` normalises to a gold);
- `cover_em` = `substring_match` (cover EM: a normalised gold is contained in the normalised answer);
- `f1` = `f1` (best SQuAD token F1 against the golds);
- `searchr1_em` = Search-R1's `qa_em.compute_score_em` on prompt + response (bug-for-bug);
- `format_valid` = the `format` scorer (Search-R1's tag grammar on the response alone, trailing
  end-of-turn markers ignored) is 1.

Failures are counted, never folded into the scores: a trajectory whose search failed (the retriever
unreachable, a refused query, a spent budget) keeps its `error` and finish reason and is scored as it is
(the model answered without its search engine); a question the reward service could not score keeps
`score_error` and None scores, and is left out of the score means. `stats.metrics_of` counts both, and the
command exits 1 when their share passes `eval.max_failure_rate`.

What this module does not do: start engines or servers (the `eval` command does; tests pass theirs),
train, or judge answers itself.

Departures from Search-R1's evaluation (its `main_ppo` with `val_only`): it reports only the reward of
the greedy rollout per `data_source`; here greedy and sampled are reported separately, with F1, format
validity and search behaviour, also per any keys of the questions' metadata the caller names
(`EvalConfig.group_by`, e.g. a question type). The prompt is Search-R1's: the row's `prompt` messages
through the chat template when the row has them (as Search-R1's dataset does), else the rollout
worker's `render_prompt(question)` — identical for Search-R1's own data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from searchr1.core.clients.reward import RewardError
from searchr1.core.datasets import DatasetError, Question, parse_row, read_rows
from searchr1.core.protocol import SEARCH_R1, render_prompt
from searchr1.rollout.agent import AgentLimits, Sampling, SearchFn, TrajectoryResult, run_trajectory
from searchr1.rollout.engine import Generator, TextCodec
from searchr1.rollout.evaluation.report import write_outputs
from searchr1.rollout.sampler import Scorer
from searchr1.rollout.settings import AgentSettings, EvalSettings


class EvalDataError(DatasetError):
    """A test-set file or row that cannot be read."""


# --------------------------------------------------------------------------------------------- reading


def row_to_question(row: Mapping[str, Any], index: int) -> Question:
    """One Search-R1 parquet row or tasks JSONL object → `Question`, parsed by
    `searchr1.core.datasets.parse_row` (gold answers from `reward_model.ground_truth.target`, else
    `golden_answers`); a row without gold answers cannot be evaluated."""
    try:
        q = parse_row(row, index, default_split="test")
    except DatasetError as exc:
        raise EvalDataError(str(exc)) from None
    if not q.golden_answers:
        raise EvalDataError(f"row {index}: no gold answers (golden_answers or reward_model.ground_truth.target)")
    return q


def read_questions(path: str | Path, limit: int | None = None) -> list[Question]:
    """Read a Search-R1 `.parquet` test set (unchanged) or our tasks `.jsonl`; the first `limit` rows.

    Ids must be unique within a `data_source`. FlashRAG numbers several test sets' rows alike (`test_0`,
    … in nq, triviaqa, bamboogle), so when ids repeat across sources every id becomes
    `{data_source}/{id}`."""
    try:
        rows = read_rows(path, limit)
    except DatasetError as exc:
        raise EvalDataError(str(exc).replace("dataset", "test set", 1)) from None
    questions = [row_to_question(r, i) for i, r in enumerate(rows)]
    if not questions:
        raise EvalDataError(f"{path}: no questions")
    if len({q.task_id for q in questions}) != len(questions):
        if len({(q.data_source, q.task_id) for q in questions}) != len(questions):
            raise EvalDataError(f"{path}: question ids are not unique within a data_source")
        questions = [dataclasses.replace(q, task_id=f"{q.data_source}/{q.task_id}") for q in questions]
    return questions


def prompt_text(q: Question, tokenizer: Any, template: str = SEARCH_R1) -> str:
    """The prompt the policy sees: the row's messages through the chat template (Search-R1's dataset
    does this; without a chat template, the first message's content), else `render_prompt`."""
    if q.messages:
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(q.messages, add_generation_prompt=True, tokenize=False)
        return q.messages[0]["content"]
    return render_prompt(q.question, tokenizer, template)


# --------------------------------------------------------------------------------------------- running


@dataclass(frozen=True)
class EvalConfig:
    """How to evaluate: samples, sampling, limits and concurrency. The sampling, limits, template and
    group keys come from the rollout settings (`run.eval_config`: `[rollout.agent]`, `[rollout.eval]`)."""

    sampling: Sampling
    """How the sampled trajectories sample; its `seed` is the base seed (each trajectory gets its own,
    derived from question and sample index). The greedy one is temperature 0 with the same `extra_args`."""
    limits: AgentLimits
    template: str
    group_by: tuple[str, ...]
    """Keys the reports break metrics down by: `data_source` or any key of a question's metadata
    (`Question.group_value`); each record carries its question's values of them."""
    samples: int = 1
    """K sampled trajectories per question (0: greedy only)."""
    greedy: bool = True
    """Run the greedy trajectory too."""
    concurrency: int = 16
    """Questions in flight at once (each runs 1 + K trajectories concurrently on the one engine)."""

    @classmethod
    def from_settings(cls, agent: AgentSettings, eval_settings: EvalSettings, *, seed: int,
                      temperature: float | None = None, max_context_tokens: int | None = None,
                      **how: Any) -> EvalConfig:
        """The config of `agent` (limits, template, sampling with `seed` and, when given, `temperature`)
        and `eval_settings` (group keys); `how`: samples, greedy, concurrency."""
        return cls(sampling=Sampling.from_settings(agent, seed=seed, temperature=temperature),
                   limits=AgentLimits.from_settings(agent, max_context_tokens=max_context_tokens),
                   template=agent.template, group_by=tuple(eval_settings.group_by), **how)

    def __post_init__(self) -> None:
        if self.samples < 0 or self.concurrency < 1 or self.sampling.temperature < 0:
            raise ValueError("samples must be >= 0, concurrency >= 1 and temperature >= 0")
        if not self.greedy and self.samples == 0:
            raise ValueError("nothing to run: greedy is off and samples is 0")
        clash = sorted(set(self.group_by) & (_RECORD_FIELDS - {"data_source"}))
        if clash or not all(isinstance(k, str) and k for k in self.group_by):
            raise ValueError("group keys must be non-empty names other than a record field, "
                             f"got {clash or list(self.group_by)}")


@dataclass
class EvalRecord:
    """One scored trajectory of one question (`mode` greedy or sampled, `sample` its index)."""

    qid: str
    mode: str
    sample: int
    data_source: str
    question: str
    golden_answers: list[str]
    response: str
    answer: str | None
    finish_reason: str
    num_turns: int
    num_searches: int
    response_tokens: int
    generated_tokens: int
    em: float | None = None
    cover_em: float | None = None
    f1: float | None = None
    searchr1_em: float | None = None
    format_valid: float | None = None
    error: str | None = None
    """Why the environment failed this trajectory (a failed search), or None."""
    score_error: str | None = None
    """Why the reward service could not score this trajectory (its scores are then None), or None."""
    groups: dict[str, str | None] = field(default_factory=dict)
    """The question's values of the group keys other than `data_source` (None: the question has none)."""

    def to_json(self) -> dict[str, Any]:
        """The `eval.json` record: the group values sit after `data_source`, as fields of their own."""
        d = asdict(self)
        groups = d.pop("groups")
        head = {k: d.pop(k) for k in ("qid", "mode", "sample", "data_source")}
        return {**head, **groups, **d}


_RECORD_FIELDS = frozenset(f.name for f in fields(EvalRecord))


SCORERS: tuple[tuple[str, str], ...] = (("em", "exact_match"), ("cover_em", "substring_match"), ("f1", "f1"),
                                        ("searchr1_em", "searchr1_em"), ("format_valid", "format"))
"""Record field ← reward-service scorer (all on `{prompt, response, golden_answers, num_searches}` items;
`searchr1_em` scores prompt + response, the others the response)."""


def sample_seed(base: int, question_index: int, sample: int) -> int:
    """A distinct, reproducible seed per (question, sample), within vLLM's 63-bit range."""
    return (base * 1_000_003 + question_index * 10_007 + sample * 101) % (2**62)


async def score_trajectories(scorer: Scorer, prompt: str, responses: Sequence[str], searches: Sequence[int],
                             golds: Sequence[str]) -> dict[str, list[float]]:
    """Every `SCORERS` score of each response (one request per scorer, concurrently). The reward client's
    errors propagate (`eval_question` records them)."""
    items = [{"prompt": prompt, "response": r, "golden_answers": list(golds), "num_searches": n}
             for r, n in zip(responses, searches, strict=True)]
    results = await asyncio.gather(*(scorer.score(name, items) for _, name in SCORERS))
    return {key: [float(s) for s in res.scores] for (key, _), res in zip(SCORERS, results)}


SCORING_ERRORS: tuple[type[BaseException], ...] = (RewardError, ValueError, KeyError)
"""What a failed scoring request raises: the reward client's error, or an answer it cannot read."""


async def eval_question(index: int, q: Question, generator: Generator, codec: TextCodec, tokenizer: Any,
                        search: SearchFn, scorer: Scorer, config: EvalConfig) -> list[EvalRecord]:
    """Greedy + K sampled trajectories of one question, concurrently, then scored."""
    prompt = prompt_text(q, tokenizer, config.template)
    prompt_ids = codec.encode(prompt)
    runs: list[tuple[str, int, Sampling]] = []
    if config.greedy:
        # greedy decoding ignores the seed; a fixed per-question one keeps seeded logits processors
        # (e.g. the steering used with random models) reproducible across runs and `--seed`s
        runs.append(("greedy", 0, dataclasses.replace(config.sampling, temperature=0.0, seed=index)))
    for k in range(config.samples):
        seed = sample_seed(config.sampling.seed or 0, index, k)
        runs.append(("sampled", k, dataclasses.replace(config.sampling, seed=seed)))
    tasks: list[asyncio.Task[TrajectoryResult]] = []
    async with asyncio.TaskGroup() as tg:
        for mode, k, sampling in runs:
            tasks.append(tg.create_task(run_trajectory(prompt_ids, generator, codec, search, config.limits,
                                                       sampling, f"eval-{index}-{mode}{k}")))
    results = [t.result() for t in tasks]
    responses = [codec.decode(r.response_ids) for r in results]
    score_error = None
    try:
        scores: dict[str, list[float | None]] = dict(await score_trajectories(
            scorer, prompt, responses, [r.num_searches for r in results], q.golden_answers))
    except SCORING_ERRORS as exc:
        score_error = " ".join(str(exc).split()) or type(exc).__name__
        scores = {key: [None] * len(results) for key, _ in SCORERS}
    return [
        EvalRecord(
            qid=q.task_id, mode=mode, sample=k, data_source=q.data_source, question=q.question,
            golden_answers=list(q.golden_answers), response=text, answer=r.answer, finish_reason=r.finish_reason,
            num_turns=r.num_turns, num_searches=r.num_searches, response_tokens=len(r.response_ids),
            generated_tokens=r.generated_tokens, error=r.error, score_error=score_error,
            groups={key: q.group_value(key) for key in config.group_by if key != "data_source"},
            **{key: scores[key][i] for key, _ in SCORERS},
        )
        for i, ((mode, k, _), r, text) in enumerate(zip(runs, results, responses))
    ]


async def run_eval(questions: Sequence[Question], generator: Generator, codec: TextCodec, tokenizer: Any,
                   search: SearchFn, scorer: Scorer, config: EvalConfig,
                   on_question: Callable[[list[EvalRecord]], None] | None = None) -> list[EvalRecord]:
    """Evaluate every question (at most `config.concurrency` at once); records in question order."""
    gate = asyncio.Semaphore(config.concurrency)

    async def one(i: int, q: Question) -> list[EvalRecord]:
        async with gate:
            recs = await eval_question(i, q, generator, codec, tokenizer, search, scorer, config)
        if on_question is not None:
            on_question(recs)
        return recs

    out: list[list[EvalRecord]] = []
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(i, q)) for i, q in enumerate(questions)]
    out = [t.result() for t in tasks]
    return [r for recs in out for r in recs]


@dataclass
class EvalRun:
    """The result of `evaluate`: the records, the JSON document written, where."""

    records: list[EvalRecord]
    document: dict[str, Any]
    out_dir: Path
    meta: dict[str, Any] = field(default_factory=dict)


async def evaluate(data: str | Path, out_dir: str | Path, generator: Generator, codec: TextCodec, tokenizer: Any,
                   search: SearchFn, scorer: Scorer, config: EvalConfig, *, limit: int | None = None,
                   meta: Mapping[str, Any] | None = None,
                   on_question: Callable[[list[EvalRecord]], None] | None = None) -> EvalRun:
    """read → run → aggregate → write, on an already-started engine and clients."""
    questions = await asyncio.to_thread(read_questions, data, limit)
    t0 = time.perf_counter()
    records = await run_eval(questions, generator, codec, tokenizer, search, scorer, config, on_question)
    info = {
        **dict(meta or {}), "data": str(data), "questions": len(questions), "greedy": config.greedy,
        "samples": config.samples, "temperature": config.sampling.temperature, "top_p": config.sampling.top_p,
        "top_k": config.sampling.top_k, "seed": config.sampling.seed, "max_turns": config.limits.max_turns,
        "max_tokens_per_turn": config.limits.max_tokens_per_turn,
        "max_response_tokens": config.limits.max_response_tokens,
        "group_by": list(config.group_by), "scorers": {k: name for k, name in SCORERS},
        "wall_seconds": round(time.perf_counter() - t0, 3),
    }
    doc = await asyncio.to_thread(write_outputs, out_dir, [r.to_json() for r in records], info, config.group_by)
    return EvalRun(records, doc, Path(out_dir), info)
