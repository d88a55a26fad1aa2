"""A small trajectory archive with Search-R1 shaped responses (think, search, information, answer) whose
loss masks match their text, for the viewer's tests and benchmark: written with the learner's own writer
from `searchr1.core.schemas` objects."""

from __future__ import annotations

import random
from pathlib import Path

from searchr1.core.schemas import Task, Trajectory, TrajectoryGroup
from searchr1.learner.tools.archive import ArchiveWriter

CITIES = [("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"),
          ("Egypt", "Cairo"), ("Norway", "Oslo"), ("Canada", "Ottawa")]


def _words(text: str) -> int:
    return max(1, len(text.split()))


def response(rng: random.Random, country: str, city: str, *, searches: int, correct: bool, malformed: bool,
             repeat: bool = False) -> tuple[str, list[int], list[float]]:
    """(text, loss mask, behaviour log-probs) of one response: one token per word, environment blocks
    masked."""
    text, mask, lps = "", [], []

    def add(chunk: str, own: bool) -> None:
        nonlocal text
        text += chunk
        n = _words(chunk)
        mask.extend([1 if own else 0] * n)
        lps.extend([-rng.uniform(0.05, 4.0) if own else 0.0 for _ in range(n)])

    for i in range(searches):
        query = f"capital of {country}" if (repeat or i == 0) else f"{country} capital city"
        add(f"<think> I need the capital of {country}. </think>\n<search> {query} </search>", True)
        add(f"\n\n<information>Doc 1(Title: \"{country}\") {country} is a country; its capital is {city}.\n"
            f"Doc 2(Title: \"{city}\") {city} is the largest city of {country}.\n</information>\n\n", False)
    answer = city if correct else "Berlin"
    if malformed:
        add(f"The answer is {answer} <answer> {answer}", True)
    else:
        add(f"<think> The documents say {city}. </think>\n<answer> {answer} </answer>", True)
    return text, mask, lps


def group(step: int, k: int, *, rng: random.Random, size: int = 4, collapse: bool = False) -> TrajectoryGroup:
    country, city = CITIES[k % len(CITIES)]
    task = Task(task_id=f"q{k}", question=f"what is the capital of {country}?", golden_answers=[city],
                data_source="nq" if k % 2 == 0 else "hotpotqa", group_size=size)
    trajs = []
    for _ in range(size):
        searches = rng.randrange(0, 3)
        correct = rng.random() < 0.3 + 0.05 * step
        malformed = collapse and rng.random() < 0.8
        text, mask, lps = response(rng, country, city, searches=searches, correct=correct and not malformed,
                                   malformed=malformed, repeat=collapse)
        ids = [rng.randrange(2, 30000) for _ in mask]
        reward = 1.0 if correct and not malformed else 0.0
        finish = "length" if malformed else "answer"
        trajs.append(Trajectory(prompt_ids=[rng.randrange(2, 30000) for _ in range(12)], response_ids=ids,
                                loss_mask=mask, behavior_logprobs=lps, reward=reward,
                                reward_components={"em": reward, "format": 0.0 if malformed else 1.0},
                                num_turns=searches + 1, num_searches=searches, finish_reason=finish,
                                response_text=text))
    return TrajectoryGroup(task=task, policy_version=max(0, step - rng.randrange(0, 2)), sampling_temperature=1.0,
                           worker_id=f"worker-{k % 2}", trajectories=trajs)


def write_archive(directory: Path, *, steps: int = 12, groups_per_step: int = 4, size: int = 4,
                  every_steps: int = 5, collapse_from: int | None = None, seed: int = 0,
                  first_step: int = 1) -> Path:
    """Write `steps` steps (from `first_step`) of `groups_per_step` groups each; from `collapse_from` on, most responses are
    malformed, truncated and repeat their query. Returns the directory."""
    rng = random.Random(seed)
    writer = ArchiveWriter(directory, every_steps=every_steps)
    for step in range(first_step, first_step + steps):
        collapse = collapse_from is not None and step >= collapse_from
        gs = [group(step, (step * groups_per_step + j) % len(CITIES) if groups_per_step < len(CITIES) else j,
                    rng=rng, size=size, collapse=collapse) for j in range(groups_per_step)]
        writer.append(step, gs, [f"{step}-{j}" for j in range(len(gs))])
    return Path(directory)


def write_step_log(run_dir: Path, *, steps: int = 12, collapse_from: int | None = None, run: str = "default") -> Path:
    """A learner JSONL step log at `RUN_DIR/learner/{run}.jsonl` with the trainer's figures (entropy, KL,
    gradient norm); after `collapse_from` entropy falls and KL and the gradient norm climb."""
    import json

    path = Path(run_dir) / "learner" / f"{run}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for step in range(1, steps + 1):
            late = collapse_from is not None and step >= collapse_from
            k = step - collapse_from + 1 if late else 0
            f.write(json.dumps({"step": step, "entropy": 1.2 - 0.02 * step - 0.3 * k, "kl_loss": 0.001 * step + 0.05 * k,
                                "approx_kl": 0.0005 * step + 0.02 * k, "grad_norm": 0.8 + 0.05 * step + 2.0 * k}) + "\n")
    return path
