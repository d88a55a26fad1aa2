"""The learner's side of the sampling contract: the temperature its log-probs assume.

The learner computes every log-prob (π_old, π, the reference) from the raw logits, i.e. at temperature 1
(`TRAINING_TEMPERATURE`), while the PPO ratio and the importance weights compare them with the behaviour
log-probs the worker recorded while sampling. A group sampled at another temperature would silently
train against a different distribution, so the contract is enforced in three places, all from here:

- tasks the dispatcher publishes are stamped with `TRAINING_TEMPERATURE` (`task_sampling`), which a
  worker must use (`Task.sampling.temperature` set = the worker does not decide);
- `LearnerSettings` refuses a configured `dispatcher.temperature` other than it, at start
  (`check_rollout_temperature`);
- a group whose `TrajectoryGroup.sampling_temperature` differs is not trained on: the learner
  dead-letters it with `temperature_mismatch`'s reason (`searchr1_learner_groups_dropped_total
  {reason="temperature"}`).

Search-R1 instead divides the logits by the rollout temperature before computing log-probs; its published
runs sample at 1, which is the one setting supported here.
"""

from __future__ import annotations

from searchr1.core.schemas import SamplingParams, TrajectoryGroup

TRAINING_TEMPERATURE = 1.0
"""The softmax temperature of the learner's log-probs."""


def check_rollout_temperature(temperature: float, field: str = "dispatcher.temperature") -> float:
    """`temperature` if it is the training temperature; a ValueError naming `field` otherwise."""
    if temperature != TRAINING_TEMPERATURE:
        raise ValueError(
            f"{field} = {temperature}: the learner computes log-probs at temperature {TRAINING_TEMPERATURE}, "
            f"so training groups must be sampled at {TRAINING_TEMPERATURE} (set {field} = "
            f"{TRAINING_TEMPERATURE} or leave it out)")
    return temperature


def task_sampling(top_p: float | None) -> SamplingParams:
    """Sampling params stamped on a training task: the training temperature, and `top_p` when the
    learner sets one (None = the worker's setting)."""
    return SamplingParams(temperature=TRAINING_TEMPERATURE, top_p=top_p)


def temperature_mismatch(group: TrajectoryGroup) -> str | None:
    """Why `group` cannot be trained on because of the temperature it was sampled at, or None."""
    if group.sampling_temperature == TRAINING_TEMPERATURE:
        return None
    return (f"sampled at temperature {group.sampling_temperature} by worker {group.worker_id}, but the "
            f"learner computes log-probs at temperature {TRAINING_TEMPERATURE}")
