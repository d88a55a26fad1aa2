"""The learner process: one loop that reads top to bottom as named stages

    read groups → filter (replays, staleness) → batch → advantages → train step → checkpoint → ack →
    publish weights

plus the dispatcher task feeding the tasks stream and (optionally) the HTTP server for snapshots.

Delivery guarantees: a trajectory-stream entry is acked only after the step that consumed it is
checkpointed, and the checkpoint records the consumed task ids; a learner killed before acking re-reads
its groups after restart (reclaimed once idle past the visibility timeout) and acks without retraining
those whose task ids the checkpoint already holds. On start the learner resumes from the latest
checkpoint and (re)announces its current version (version 0 = the initial weights).

Data parallel under torchrun: rank 0 alone talks to Redis and broadcasts each step's groups (msgpack,
never pickle) to the other ranks; every rank trains on its shard; checkpoints and snapshots are
gathered to rank 0, which writes them.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch
import torch.distributed as dist

from searchr1.core.aio import stop_task
from searchr1.core.schemas import Task, TrajectoryGroup, decode, encode
from searchr1.core.streams import Entry, StreamKeys, TypedStream
from searchr1.learner.advantages import OUTCOME_ESTIMATORS, outcome_advantages, split_stale
from searchr1.learner.batch import Batch, build_batch
from searchr1.learner.checkpoint import Checkpointer, Component, TrainState
from searchr1.learner.metrics import LearnerMetrics, StepLog
from searchr1.learner.model import (
    DistInfo,
    export_weights,
    load_critic,
    load_policy,
    load_reference,
    resolve_device,
)
from searchr1.learner.publisher import WeightPublisher
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.trainer import Trainer, build_optimizer

log = logging.getLogger("searchr1.learner")

TRAJECTORY_GROUP = "learner"
TASK_GROUP = "rollout"


EM_COMPONENT_KEYS = ("em", "searchr1_em", "exact_match", "answer_correct")
"""Reward components read as exact match, first found wins (our composite's `em` key, Search-R1's
`searchr1_em` scorer, our `exact_match` scorer, `searchr1_em_format`'s `answer_correct` fact); inside a
composite's breakdown also as `<component>.<key>` (e.g. `searchr1_em_format.answer_correct`)."""


def em_component(components: dict[str, float]) -> float | None:
    """The exact-match component of a trajectory's reward breakdown, if it has one."""
    for key in EM_COMPONENT_KEYS:
        if key in components:
            return components[key]
    for key in EM_COMPONENT_KEYS:
        for name, value in components.items():
            if name.endswith("." + key):
                return value
    return None


@dataclass
class Training:
    """The models and the trainer of one process."""

    trainer: Trainer
    components: list[Component]
    pad_id: int


def build_training(settings: LearnerSettings, info: DistInfo) -> Training:
    """Load policy (+ reference, + critic) and their optimizers as the settings ask."""
    device = resolve_device(settings.device)
    if device.type == "cpu" and settings.threads:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    a = settings.algorithm
    policy = load_policy(settings, device, info)
    opt, sched = build_optimizer(policy, settings.optim.lr, settings, settings.optim.warmup_ratio)
    components = [Component("policy", policy, opt, sched)]
    need_ref = (a.use_kl_loss and a.advantage != "gae" and a.kl_loss_coef > 0) or a.kl_in_reward
    if a.use_kl_loss and a.kl_loss_coef == 0:
        settings = settings.model_copy(update={"algorithm": a.model_copy(update={"use_kl_loss": False})})
    reference = load_reference(settings, device) if need_ref else None
    critic_kw: dict[str, Any] = {}
    if a.advantage == "gae":
        critic = load_critic(settings, device, info)
        c_opt, c_sched = build_optimizer(critic, settings.optim.critic_lr, settings, settings.optim.critic_warmup_ratio)
        components.append(Component("critic", critic, c_opt, c_sched))
        critic_kw = {"critic": critic, "critic_optimizer": c_opt, "critic_scheduler": c_sched}
    trainer = Trainer(settings, policy, opt, sched, device=device, info=info, reference=reference, **critic_kw)
    config = getattr(policy, "config", None)
    pad = getattr(config, "pad_token_id", None)
    return Training(trainer, components, int(pad) if pad is not None else 0)


# ---------------------------------------------------------------------------- rank-to-rank transport


def broadcast_groups(groups: list[TrajectoryGroup] | None, info: DistInfo) -> list[TrajectoryGroup] | None:
    """Rank 0's groups on every rank (None = stop). msgpack bytes in a uint8 tensor; gloo or NCCL."""
    if not info.enabled:
        return groups
    device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
    if info.is_main:
        payload = b"" if groups is None else msgpack.packb([encode(g) for g in groups], use_bin_type=True)
        size = torch.tensor([len(payload) if groups is not None else -1], dtype=torch.long, device=device)
    else:
        size = torch.zeros(1, dtype=torch.long, device=device)
    dist.broadcast(size, 0)
    n = int(size.item())
    if n < 0:
        return None
    buf = (torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device) if info.is_main
           else torch.empty(n, dtype=torch.uint8, device=device))
    if n:
        dist.broadcast(buf, 0)
    if info.is_main:
        return groups
    return [decode(TrajectoryGroup, raw) for raw in msgpack.unpackb(buf.cpu().numpy().tobytes(), raw=False)]


# ---------------------------------------------------------------------------- the loop


@dataclass
class StepInput:
    """What the read and filter stages produce for one step."""

    entries: list[Entry[TrajectoryGroup]] = field(default_factory=list)
    groups: list[TrajectoryGroup] = field(default_factory=list)
    replays: list[Entry[TrajectoryGroup]] = field(default_factory=list)
    stale: list[Entry[TrajectoryGroup]] = field(default_factory=list)


class Learner:
    """Runs the learner loop. Dependencies are passed in; `redis` may be None on ranks other than 0."""

    def __init__(
        self,
        settings: LearnerSettings,
        training: Training,
        checkpointer: Checkpointer,
        publisher: WeightPublisher,
        metrics: LearnerMetrics,
        step_log: StepLog | None,
        *,
        redis=None,
        info: DistInfo | None = None,
    ) -> None:
        self.s = settings
        self.training = training
        self.checkpointer = checkpointer
        self.publisher = publisher
        self.metrics = metrics
        self.step_log = step_log
        self.redis = redis
        self.info = info or DistInfo()
        self.keys = StreamKeys(settings.redis.run)
        self.state = TrainState()
        self._unacked: list[str] = []
        self._dispatcher = None
        self.trajectories: TypedStream[TrajectoryGroup] | None = None
        self.tasks: TypedStream[Task] | None = None
        if redis is not None:
            self.trajectories = TypedStream(
                redis, self.keys.trajectories, TrajectoryGroup, TRAJECTORY_GROUP, dead_key=self.keys.dead,
                visibility_timeout_ms=settings.visibility_timeout_ms, max_deliveries=settings.max_deliveries)
            self.tasks = TypedStream(redis, self.keys.tasks, Task, TASK_GROUP, dead_key=self.keys.dead)

    # ------------------------------------------------------------------ start-up

    async def start(self) -> TrainState:
        """Resume from the latest checkpoint and announce the current version."""
        restored = await asyncio.to_thread(self.checkpointer.load, self.training.components)
        if restored is not None:
            self.state = restored
            log.info("resumed from step %d (version %d)", restored.step, restored.version)
        if self.trajectories is not None:
            await self.trajectories.ensure_group()
            await self.tasks.ensure_group()
        await self.publish_weights()  # a collective under FSDP: every rank writes-or-not alike
        return self.state

    # ------------------------------------------------------------------ stages

    async def read_groups(self, stop: asyncio.Event) -> StepInput:
        """Stage 1: reclaim groups left unacked by a dead learner, then read new ones until a step's
        worth (`groups_per_step`) is in hand or `stop` is set."""
        want = self.s.batch.groups_per_step
        got = StepInput()
        got.entries.extend(await self.trajectories.reclaim(self.s.consumer, count=want))
        while len(got.entries) < want and not stop.is_set():
            got.entries.extend(await self.trajectories.read(
                self.s.consumer, count=want - len(got.entries), block_ms=self.s.read_block_ms))
            if len(got.entries) < want and await self.data_exhausted():
                break  # the last, partial step of the run
        return got

    async def data_exhausted(self) -> bool:
        """True when the dispatcher has published its last epoch and every task and group is consumed."""
        if self._dispatcher is None or not self._dispatcher.exhausted:
            return False
        return await self.tasks.in_flight() == 0 and await self.trajectories.lag() == 0

    def _min_policy_version(self) -> int:
        """The oldest version a group of a task published now may be generated by and still be trained."""
        return max(0, self.state.version - self.s.algorithm.max_staleness)

    def filter_groups(self, got: StepInput) -> StepInput:
        """Stage 2: skip replays of task ids already trained on and groups staler than `max_staleness`."""
        fresh = []
        seen = set(self.state.consumed)
        for e in got.entries:
            tid = e.value.task.task_id
            if tid in seen:
                got.replays.append(e)
            else:
                seen.add(tid)
                fresh.append(e)
        kept, dropped = split_stale([e.value for e in fresh], self.state.version, self.s.algorithm.max_staleness)
        dropped_ids = {id(g) for g in dropped}
        got.stale = [e for e in fresh if id(e.value) in dropped_ids]
        got.groups = kept
        self.metrics.dropped.labels("replay").inc(len(got.replays))
        self.metrics.dropped.labels("stale").inc(len(got.stale))
        if self._dispatcher is not None:  # replace what will not be trained on
            self._dispatcher.grant(len(got.replays) + len(got.stale), self._min_policy_version())
        return got

    def make_batch(self, groups: list[TrajectoryGroup]) -> Batch:
        """Stages 3–4: pad the groups into a batch and compute outcome advantages (GAE happens in the
        trainer, after the critic's value pass)."""
        batch = build_batch(groups, pad_id=self.training.pad_id, max_seq_len=self.s.batch.max_seq_len)
        a = self.s.algorithm
        if a.advantage in OUTCOME_ESTIMATORS:
            batch = outcome_advantages(batch, a.advantage, a.grpo_eps)
        return batch

    def train(self, batch: Batch) -> dict[str, float]:
        """Stage 5: one training step (every rank)."""
        return self.training.trainer.train_step(batch, self.state.version)

    def checkpoint(self) -> None:
        """Stage 6: save a resumable checkpoint (collective)."""
        self.checkpointer.save(self.state, self.training.components)

    async def ack(self) -> None:
        """Stage 7: ack every group whose step is checkpointed."""
        if self._unacked and self.trajectories is not None:
            await self.trajectories.ack(*self._unacked)
        self._unacked.clear()

    async def publish_weights(self, force_write: bool = True) -> None:
        """Stage 8: snapshot (collective gather), announce and prune."""
        if force_write:
            model, state = await asyncio.to_thread(export_weights, self.training.trainer.policy, self.info)
            if self.info.is_main:
                await asyncio.to_thread(self.publisher.write, self.state.version, model, state)
        if self.info.is_main and self.redis is not None:
            wv = await self.publisher.announce(self.redis, self.keys, self.state.version)
            self.metrics.version.set(wv.version)

    # ------------------------------------------------------------------ loop

    def _group_figures(self, groups: list[TrajectoryGroup]) -> dict[str, float]:
        trajs = [t for g in groups for t in g.trajectories]
        rewards = [t.reward for t in trajs]
        out = {
            "groups": float(len(groups)), "trajectories": float(len(trajs)),
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "searches_per_trajectory": statistics.fmean(t.num_searches for t in trajs),
            "response_length_mean": statistics.fmean(len(t.response_ids) for t in trajs),
            "staleness_mean": statistics.fmean(self.state.version - g.policy_version for g in groups),
        }
        em = [v for t in trajs if (v := em_component(t.reward_components)) is not None]
        if em:
            out["em_mean"] = statistics.fmean(em)
        return out

    @staticmethod
    def _by_source(groups: list[TrajectoryGroup]) -> dict[str, dict[str, float]]:
        """Per-`data_source` reward, EM and searches of the step (the JSONL log's `by_source`), so a run
        can be split e.g. into known- and unknown-entity questions."""
        buckets: dict[str, list] = {}
        for g in groups:
            buckets.setdefault(g.task.data_source, []).extend(g.trajectories)
        out: dict[str, dict[str, float]] = {}
        for source, trajs in sorted(buckets.items()):
            row = {"trajectories": float(len(trajs)),
                   "reward_mean": statistics.fmean(t.reward for t in trajs),
                   "searches_per_trajectory": statistics.fmean(t.num_searches for t in trajs)}
            em = [v for t in trajs if (v := em_component(t.reward_components)) is not None]
            if em:
                row["em_mean"] = statistics.fmean(em)
            out[source] = row
        return out

    async def step_once(self, stop: asyncio.Event) -> bool:
        """One step on rank 0 (or single process). Returns False when stopped before training."""
        got = await self.read_groups(stop)
        if stop.is_set() and len(got.entries) < self.s.batch.groups_per_step:
            return False  # no partial step on shutdown: the unacked groups are re-read after a restart
        got = self.filter_groups(got)
        self._unacked.extend(e.id for e in got.replays)  # already checkpointed: safe to ack now
        self._unacked.extend(e.id for e in got.stale)
        if not got.groups:
            await self.ack()
            return not stop.is_set()
        broadcast_groups(got.groups, self.info)
        skipped = {e.id for e in got.replays} | {e.id for e in got.stale}
        await self._train_and_commit(got.groups, [e.id for e in got.entries if e.id not in skipped])
        return True

    async def _train_and_commit(self, groups: list[TrajectoryGroup], entry_ids: list[str]) -> None:
        t0 = time.perf_counter()
        batch = self.make_batch(groups)
        figures = await asyncio.to_thread(self.train, batch)
        step_seconds = time.perf_counter() - t0
        figures.update(self._group_figures(groups))
        figures["by_source"] = self._by_source(groups)  # type: ignore[assignment]  # JSONL only
        figures.update(step_seconds=step_seconds, tokens=float(batch.num_tokens),
                       loss_tokens=float(batch.num_loss_tokens),
                       tokens_per_second=batch.num_tokens / max(step_seconds, 1e-9))
        self.state.step += 1
        self.state.version += 1
        self.state.consumed.update(g.task.task_id for g in groups)
        self._unacked.extend(entry_ids)
        if self.state.step % self.s.checkpoint.every == 0:
            if self._dispatcher is not None:  # read on the loop thread, where the dispatcher runs
                self.state.dispatcher = self._dispatcher.position()
            await asyncio.to_thread(self.checkpoint)
            await self.ack()
        await self.publish_weights()
        if self._dispatcher is not None:  # the next tasks are sampled with the weights just announced
            self._dispatcher.grant(len(groups), self._min_policy_version())
        if self.info.is_main:
            self.metrics.groups.inc(len(groups))
            self.metrics.trajectories.inc(figures["trajectories"])
            self.metrics.tokens.inc(batch.num_tokens)
            self.metrics.observe_step(figures)
            if self.step_log is not None:
                self.step_log.write(self.state.step, {"version": self.state.version, **figures})
            log.info("step %d: loss %.4f reward %.3f %.0f tok/s", self.state.step, figures.get("loss", 0.0),
                     figures["reward_mean"], figures["tokens_per_second"])

    async def run(self, stop: asyncio.Event, max_steps: int | None = None, dispatcher=None) -> TrainState:
        """Train until `stop`, `max_steps` (default `optim.total_steps`) or the dispatcher runs dry.
        Ranks other than 0 follow rank 0's broadcasts."""
        limit = max_steps if max_steps is not None else self.s.optim.total_steps
        if not self.info.is_main:
            while True:  # rank 0 always ends with a stop broadcast
                groups = broadcast_groups(None, self.info)
                if groups is None:
                    break
                await self._train_and_commit(groups, [])
            return self.state
        disp_task = None
        self._dispatcher = dispatcher
        halt = asyncio.Event()  # ends the dispatcher when this loop ends (a cancel alone can be lost: core.aio)
        if dispatcher is not None:
            disp_task = asyncio.create_task(dispatcher.run(halt))
        try:
            while self.state.step < limit and not stop.is_set():
                await self.step_once(stop)
                if await self.data_exhausted() and await self.trajectories.pending() == 0:
                    log.info("dataset exhausted after %d epochs: stopping", self.s.dispatcher.epochs)
                    break
        finally:
            if self.info.enabled:
                broadcast_groups(None, self.info)
            halt.set()
            if disp_task is not None:
                await stop_task(disp_task, timeout=10.0)
        return self.state


# ---------------------------------------------------------------------------- process entry point


def init_distributed() -> DistInfo:
    """Join the torchrun process group when launched with WORLD_SIZE > 1 (gloo on CPU, NCCL on GPU)."""
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    from searchr1.learner.model import dist_info

    return dist_info()


async def run_learner(settings: LearnerSettings, stop: asyncio.Event | None = None,
                      max_steps: int | None = None) -> TrainState:
    """Everything `searchr1 train` does: models, Redis, dispatcher, weight server, metrics, loop."""
    from searchr1.core.metrics import start_metrics_server
    from searchr1.core.servers import HttpServer, install_shutdown_signals
    from searchr1.core.streams import connect
    from searchr1.learner.data import load_tasks, oversample
    from searchr1.learner.dispatcher import Dispatcher
    from searchr1.learner.publisher import weights_app

    info = init_distributed()
    stop = stop or asyncio.Event()
    install_shutdown_signals(stop)
    training = await asyncio.to_thread(build_training, settings, info)
    publisher = WeightPublisher(settings.weights.dir, keep=settings.weights.keep)
    metrics = LearnerMetrics()
    step_log = None
    http = metrics_server = redis = None
    if info.is_main:
        wandb_run = None
        if settings.wandb_project:
            import wandb  # optional

            wandb_run = wandb.init(project=settings.wandb_project, name=settings.redis.run,
                                   config=settings.model_dump(mode="json"))
        step_log = StepLog(settings.log_dir / f"{settings.redis.run}.jsonl", wandb_run)
        redis = connect(settings.redis.url)
        if settings.weights.http:
            http = HttpServer(weights_app(publisher), settings.weights.host, settings.weights.port)
            await http.start()
            publisher.base_url = f"http://{settings.weights.public_host or settings.weights.host}:{http.port}"
        if settings.metrics_port is not None:
            metrics_server = start_metrics_server(metrics.registry, settings.metrics_host, settings.metrics_port)
    learner = Learner(settings, training, Checkpointer(settings.checkpoint.dir, settings.checkpoint.keep, info),
                      publisher, metrics, step_log, redis=redis, info=info)
    try:
        state = await learner.start()
        dispatcher = None
        if info.is_main and settings.dispatcher.enabled and settings.dispatcher.dataset:
            pos = state.dispatcher or {}
            budget = (settings.algorithm.max_staleness + 1) * settings.batch.groups_per_step
            specs = oversample(load_tasks(settings.dispatcher.dataset), settings.dispatcher.source_repeats)
            dispatcher = Dispatcher(learner.tasks, specs, settings.dispatcher,
                                    epoch=pos.get("epoch", 0), cursor=pos.get("cursor", 0),
                                    on_publish=metrics.tasks.inc,
                                    budget=budget if settings.dispatcher.paced else None,
                                    min_policy_version=learner._min_policy_version())
        return await learner.run(stop, max_steps=max_steps, dispatcher=dispatcher)
    finally:
        if http is not None:
            await http.stop()
        if metrics_server is not None:
            metrics_server.close()
        if redis is not None:
            await redis.aclose()
