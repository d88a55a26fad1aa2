"""Prometheus metrics of the rollout service, on their own registry (names `searchr1_rollout_…`), and
the worker's stage clock (`searchr1_rollout_stage_seconds_total{stage=…}`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from searchr1.core.metrics import RedisMetrics, StageClock, StageCollector, new_registry
from searchr1.weightsync import DeltaRefused

_LAT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
STAGES = ("weight_reload", "generation", "search_wait", "scoring", "publish")
"""The rollout worker's stages, in priority order (`StageClock`): with several trajectories in flight the
worker counts generation while any one generates, search wait while none generates and one waits on the
retriever, and so on; `queue_wait` is no task in flight (waiting for tasks, or for the weights a task
needs). `weight_reload` is fetch + verify + in-place reload."""

_COUNT = (0, 1, 2, 3, 4, 5, 6, 8, 10, 16, 32)


@dataclass
class RolloutMetrics:
    registry: CollectorRegistry = field(default_factory=new_registry)
    clock: Callable[[], float] = time.monotonic
    """The stage clock's time source."""

    def __post_init__(self) -> None:
        r = self.registry
        self.tokens_generated = Counter("searchr1_rollout_tokens_generated_total",
                                        "Tokens sampled by the policy (loss-mask 1).", registry=r)
        self.env_tokens = Counter("searchr1_rollout_env_tokens_total",
                                  "Environment tokens appended (observations, invalid-action text).", registry=r)
        self.trajectories = Counter("searchr1_rollout_trajectories_total", "Finished trajectories by finish reason.",
                                    ["finish_reason"], registry=r)
        self.groups = Counter("searchr1_rollout_groups_total", "Trajectory groups published.", registry=r)
        self.dependency_retries = Counter("searchr1_rollout_dependency_retries_total",
                                          "Retried calls to a dependency after a transient failure.",
                                          ["dependency"], registry=r)
        self.dependency_failures = Counter("searchr1_rollout_dependency_failures_total",
                                           "Calls to a dependency that failed after their retries.",
                                           ["dependency"], registry=r)
        self.task_failures = Counter("searchr1_rollout_task_failures_total",
                                     "Tasks left unacked after a failure, by stage.", ["stage"], registry=r)
        self.turns = Histogram("searchr1_rollout_turns", "Generation turns per trajectory.", buckets=_COUNT,
                               registry=r)
        self.searches = Histogram("searchr1_rollout_searches", "Searches per trajectory.", buckets=_COUNT,
                                  registry=r)
        self.obs_truncations = Counter("searchr1_rollout_observation_truncations_total",
                                       "Observations cut to max_obs_tokens (closing tag kept).", registry=r)
        self.search_latency = Histogram("searchr1_rollout_search_latency_seconds",
                                        "Latency of one batched retriever call.", buckets=_LAT, registry=r)
        self.search_batch_size = Histogram("searchr1_rollout_search_batch_size", "Queries per retriever call.",
                                           buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.reward = Histogram("searchr1_rollout_reward", "Reward per trajectory.",
                                buckets=(-1, -0.5, 0, 0.1, 0.2, 0.5, 0.8, 0.9, 1, 2), registry=r)
        self.reward_mean = Gauge("searchr1_rollout_reward_mean", "Mean reward of the last published group.",
                                 registry=r)
        self.weight_version = Gauge("searchr1_rollout_weight_version", "Policy version being generated with.",
                                    registry=r)
        self.weight_reload_seconds = Histogram("searchr1_rollout_weight_reload_seconds",
                                               "Fetch + verify + in-place reload of a new weight version.",
                                               buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300), registry=r)
        self.turns_interrupted = Counter("searchr1_rollout_turns_interrupted_total",
                                         "Turns interrupted by a weight swap and resumed (partial rollouts).",
                                         registry=r)
        self.weight_loads = Counter("searchr1_rollout_weight_loads_total",
                                    "Weight versions loaded, by form: full, delta (applied in place), delta_refused "
                                    "(out of order or unverifiable: the worker caught up instead), catch_up (the "
                                    "newest full and the deltas after it).", ["form"], registry=r)
        self.weight_refusals = Counter("searchr1_rollout_weight_refusals_total",
                                       "Weight announcements refused: an older fencing token than seen, or a "
                                       "version the learner never published.", registry=r)
        self.task_queue_lag = Gauge("searchr1_rollout_task_queue_lag",
                                    "Tasks not yet delivered to any rollout worker.", registry=r)
        self.inflight_tasks = Gauge("searchr1_rollout_inflight_tasks", "Tasks this worker is rolling out.",
                                    registry=r)
        self.redis = RedisMetrics.on(r, "rollout")
        self.group_seconds = Histogram("searchr1_rollout_group_seconds", "Wall time of one task, read to ack.",
                                       buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300), registry=r)
        self.stages = StageClock(STAGES, idle="queue_wait", clock=self.clock)
        r.register(StageCollector("searchr1_rollout_stage_seconds_total",
                                  "Wall time of the worker by stage (stages never overlap).", self.stages))

    def loader_callbacks(self) -> dict[str, Any]:
        """The `on_loaded`, `on_refused` and `stages` of a `searchr1.weightsync.WeightLoader`."""
        return {"on_loaded": self._loaded, "on_refused": self.weight_refusals.inc, "stages": self.stages,
                "on_form": lambda form: self.weight_loads.labels(form=form).inc()}

    def _loaded(self, version: int, seconds: float) -> None:
        self.weight_version.set(version)
        self.weight_reload_seconds.observe(seconds)


@dataclass
class StagedGenerator:
    """A generator whose turns run in the `generation` stage of `clock` (reload and close pass through)."""

    inner: Any
    clock: StageClock

    async def generate(self, request: Any, request_id: str) -> Any:
        with self.clock.stage("generation"):
            return await self.inner.generate(request, request_id)

    async def reload(self, weights_path: str, digest: str | None = None) -> None:
        await self.inner.reload(weights_path, digest)

    async def apply_delta(self, delta_path: str, digest: str) -> None:
        apply = getattr(self.inner, "apply_delta", None)
        if apply is None:
            raise DeltaRefused("the engine applies no deltas: it loads full versions only")
        await apply(delta_path, digest)

    async def close(self) -> None:
        await self.inner.close()


def staged_search(search: Callable[[str], Awaitable[Any]], clock: StageClock) -> Callable[[str], Awaitable[Any]]:
    """`search` with each call in the `search_wait` stage of `clock`."""

    async def run(query: str) -> Any:
        with clock.stage("search_wait"):
            return await search(query)

    return run
