"""Sizing a GPU run: for a recipe (a run config) on N GPUs, which layout trains fastest — Search-R1's
colocated lockstep (every GPU generates, then every GPU trains) or rollout and learner on their own GPUs
with a staleness bound k — and what it costs in idle GPUs. Pure: a recipe, a GPU and rates in, rows out
(the simulations run here; nothing is started).

Each layout is simulated (`pipeline.simulate`) for a few steps past the pipeline's filling, with the
recipe's batch (groups per step, group size, concurrent groups per worker, the engine's sequence cap),
one vLLM engine per rollout GPU (tensor parallel 1), the learner sharded over its GPUs (at least what its
state needs: `gpu.min_learner_gpus`), and the workload's means (`Workload`: searches, tokens per turn,
observation tokens; measured values from a run can replace the defaults). Steps per hour are the steady
state's; the idle share is GPU-seconds with nothing to do over all GPU-seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from searchr1.simulator.engine import Engine
from searchr1.simulator.gpu import (
    NEMO_RL_CHECK,
    SHAPES,
    Efficiency,
    Gpu,
    Shape,
    decode_iteration,
    learner_s_per_token,
    min_learner_gpus,
    prefill_s_per_token,
    weight_sync_s,
)
from searchr1.simulator.pipeline import Pipeline, Result, Times, simulate
from searchr1.simulator.workload import Workload


@dataclass(frozen=True)
class Recipe:
    """What a run config says about the work (the learner's and rollout's tables)."""

    name: str
    shape: Shape
    groups_per_step: int
    group_size: int
    max_staleness: int
    max_turns: int
    max_tokens_per_turn: int
    max_obs_tokens: int
    max_num_seqs: int
    max_concurrent: int
    old_logprobs: bool
    """The step needs a forward for the old log-probs (several mini-batches)."""


def shape_of(model: str) -> Shape:
    key = Path(model).name.lower().removesuffix("-instruct")
    if key not in SHAPES:
        raise ValueError(f"no GPU shape for model {model!r}: known {', '.join(s.name for s in SHAPES.values())}")
    return SHAPES[key]


def recipe_from_config(path: str | Path) -> Recipe:
    from searchr1.core.settings import load_settings
    from searchr1.learner.settings import LearnerSettings
    from searchr1.rollout.settings import RolloutSettings

    lr, ro = load_settings(LearnerSettings, path), load_settings(RolloutSettings, path)
    return Recipe(Path(path).stem, shape_of(lr.model.path), lr.batch.groups_per_step, lr.dispatcher.group_size,
                  lr.algorithm.max_staleness, ro.agent.max_turns, ro.agent.max_tokens_per_turn, ro.agent.max_obs_tokens,
                  ro.engine.max_num_seqs, ro.tasks.max_concurrent, lr.batch.mini_batches > 1)


@dataclass(frozen=True)
class Assumptions:
    """The workload's means for a GPU run (defaults stated in docs/performance.md; a run's own figures
    replace them: `searches_per_trajectory`, `response_length_mean` in its step log)."""

    prompt_tokens: float = 200.0
    """Search-R1's instruction template, the question and the chat template."""
    generated_tokens: float = 300.0
    """Tokens the policy writes per trajectory (think, search, answer)."""
    searches: float = 2.0
    obs_tokens: float = 400.0
    """Three wiki-18 passages (100-word chunks) with their titles and tags."""
    search_s: float = 0.1
    """One batched e5 + Flat search."""
    group_s: float = 0.05
    """Scoring a group over HTTP and publishing it."""
    overhead_s: float = 1.0
    """The learner's per-step checkpoint share, archive, batching and logging."""
    length_cv: float = 0.5
    """Spread of tokens per turn (coefficient of variation)."""

    def workload(self, r: Recipe) -> Workload:
        return Workload(self.prompt_tokens, self.generated_tokens, min(self.searches, r.max_turns),
                        min(self.obs_tokens, r.max_obs_tokens), r.max_turns, r.max_tokens_per_turn, self.length_cv)


@dataclass(frozen=True)
class Layout:
    rollout_gpus: int
    learner_gpus: int
    max_staleness: int
    colocated: bool = False

    @property
    def gpus(self) -> int:
        return self.rollout_gpus if self.colocated else self.rollout_gpus + self.learner_gpus

    def describe(self) -> str:
        if self.colocated:
            return f"colocated lockstep on {self.gpus}"
        return f"{self.rollout_gpus} rollout + {self.learner_gpus} learner, k = {self.max_staleness}"


@dataclass(frozen=True)
class Row:
    layout: Layout
    seconds_per_step: float
    idle_share: float
    staleness: float
    dropped: int

    @property
    def steps_per_hour(self) -> float:
        return 3600.0 / self.seconds_per_step


def times(r: Recipe, a: Assumptions, gpu: Gpu, eff: Efficiency, layout: Layout) -> Times:
    w = a.workload(r)
    context = w.prompt_tokens + (w.generated_tokens + w.searches * w.obs_tokens) / 2
    iteration = decode_iteration(r.shape, gpu, eff, context)
    prefill = prefill_s_per_token(r.shape, gpu, eff, context)
    per_token = learner_s_per_token(r.shape, gpu, eff, layout.learner_gpus, w.trained_tokens / 2, r.old_logprobs)
    sync = weight_sync_s(r.shape, eff)
    return Times(engine=lambda: Engine(iteration, prefill, r.max_num_seqs), train_s=lambda tokens: tokens * per_token,
                 overhead_s=a.overhead_s, publish_s=sync, reload_s=sync, search_s=a.search_s, group_s=a.group_s)


def run_layout(r: Recipe, a: Assumptions, gpu: Gpu, eff: Efficiency, layout: Layout, steps: int = 5,
               skip: int = 2, seed: int = 0) -> Row:
    p = Pipeline(layout.rollout_gpus, r.groups_per_step, r.group_size, layout.max_staleness, r.max_concurrent)
    res: Result = simulate(p, times(r, a, gpu, eff, layout), a.workload(r), steps + skip, seed)
    wall = res.wall_s
    rollout_busy = sum(res.rollout_busy_s)
    if layout.colocated:  # every GPU does both, in turn
        busy = rollout_busy + res.learner_busy_s * layout.gpus
    else:
        busy = rollout_busy + res.learner_busy_s * layout.learner_gpus
    return Row(layout, res.steady_seconds_per_step(skip), 1.0 - busy / (wall * layout.gpus), res.mean_staleness,
               res.dropped)


def layouts(r: Recipe, gpus: int, gpu: Gpu, staleness: tuple[int, ...] = (0, 1, 2)) -> list[Layout]:
    """Colocated lockstep on every GPU, and every split that leaves the learner what its state needs."""
    need = min_learner_gpus(r.shape, gpu)
    out = [Layout(gpus, gpus, 0, colocated=True)] if gpus >= need else []
    for learner in range(need, gpus):
        out += [Layout(gpus - learner, learner, k) for k in staleness]
    return out


def best(rows: list[Row]) -> Row:
    """The most steps per hour; within 2 % of it, the lower staleness, then fewer idle GPUs."""
    top = max(row.steps_per_hour for row in rows)
    close = [row for row in rows if row.steps_per_hour >= 0.98 * top]
    return min(close, key=lambda row: (row.layout.max_staleness, row.idle_share))


def size(r: Recipe, gpus: int, gpu: Gpu, eff: Efficiency | None = None, a: Assumptions | None = None,
         steps: int = 5, coarse: int = 12) -> tuple[Row, Row, list[Row]]:
    """(the best layout, colocated lockstep, every layout tried) for `r` on `gpus` GPUs. Splits are first
    tried at k = 2 on at most `coarse` learner counts spread over the range, then every k around the best."""
    eff, a = eff or Efficiency(), a or Assumptions()
    all_layouts = layouts(r, gpus, gpu)
    if not all_layouts:
        raise ValueError(f"{r.shape.name}'s learner needs {min_learner_gpus(r.shape, gpu)} {gpu.name} GPUs; "
                         f"{gpus} given")
    colo = [lay for lay in all_layouts if lay.colocated]
    learners = sorted({lay.learner_gpus for lay in all_layouts if not lay.colocated})
    step = max(1, len(learners) // coarse)
    probe = [Layout(gpus - n, n, 2) for n in learners[::step]]
    rows = [run_layout(r, a, gpu, eff, lay, steps) for lay in colo + probe]
    split = [row for row in rows if not row.layout.colocated]
    if split:
        centre = best(split).layout.learner_gpus
        near = [n for n in learners if abs(n - centre) <= step]
        tried = {(row.layout.learner_gpus, row.layout.max_staleness) for row in split}
        rows += [run_layout(r, a, gpu, eff, Layout(gpus - n, n, k), steps) for n in near for k in (0, 1, 2)
                 if (n, k) not in tried]
    colocated = next((row for row in rows if row.layout.colocated), None)
    chosen = best(rows)
    return chosen, colocated or chosen, rows


def with_measured(a: Assumptions, steps: list[dict]) -> Assumptions:
    """`a` with the means a run's step log measured (`searches_per_trajectory`, `response_length_mean`
    minus the searches' observations is not separable there, so only the searches are taken)."""
    searches = [s["searches_per_trajectory"] for s in steps if "searches_per_trajectory" in s]
    return replace(a, searches=sum(searches) / len(searches)) if searches else a


def nemo_rl_check(gpu: Gpu, eff: Efficiency, steps: int = 3) -> str:
    """The modelled rates against a published measurement (`gpu.NEMO_RL_CHECK`): Llama-3.1-8B GRPO on 16
    H100s, on-policy, generation and training colocated; single-turn trajectories (no search) of the
    published mean length, up to the published maximum (assumed: 150 prompt tokens, lengths spread with a
    coefficient of variation of 1, as reasoning traces are), all 2,048 of a step in flight."""
    c = NEMO_RL_CHECK
    groups = c.generation_batch // 4  # groups of 4: each engine takes an equal share at once
    prompt = 150
    r = Recipe("nemo-rl-llama-3.1-8b", c.shape, groups, 4, 0, 0, c.max_sequence - prompt, 0, 256, groups // c.gpus,
               True)
    a = Assumptions(prompt_tokens=prompt, generated_tokens=c.mean_sequence - prompt, searches=0.0, obs_tokens=0.0,
                    search_s=0.0, group_s=0.0, overhead_s=0.0, length_cv=1.0)
    row = run_layout(r, a, gpu, eff, Layout(c.gpus, c.gpus, 0, colocated=True), steps, skip=1)
    return (f"{c.shape.name} GRPO on {c.gpus} {gpu.name}, colocated on-policy, {c.generation_batch} sequences of "
            f"{c.mean_sequence} tokens: modelled {row.seconds_per_step:.1f} s/step against NeMo RL's published "
            f"{c.on_policy_step_s} s ({row.seconds_per_step / c.on_policy_step_s - 1:+.0%})")
