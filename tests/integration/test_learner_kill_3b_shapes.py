"""A `searchr1 train` process `kill -9`ed between two checkpoints, at 3B group shapes, against a Redis sized
by the run: nothing is lost, nothing is trained twice, and Redis' used_memory stays under the learner's
start-up check.

The learner acks a step's groups only once a checkpoint covers it (`checkpoint.every` 3, 4 groups per step),
so up to 12 groups sit unacked across steps, and the publisher here keeps at most `max_inflight` (4) groups
unread ahead of it, as the dispatcher bounds the rollout workers. Groups are 3B-shaped: G = 5, a 250-token
prompt, responses of 935–1,400 tokens (every 4th an observation) with a behaviour log-prob per sampled token
and ~4.2 characters of text per token; token ids stay within the tiny Qwen2's 256-token vocabulary. Redis'
maxmemory is set to what `check_redis_budget` predicts for these settings above the empty server's
used_memory.

The learner trains 4 steps (checkpoint at 3) and waits for more groups; it is killed with SIGKILL there,
holding step 4's groups unacked. Started again, it resumes from step 3, re-reads them and trains to step 9
(a checkpoint step, so every group is acked at the end). The delivery audit (`searchr1 audit`'s counting
over the archive, the last checkpoint, the stream and the log) then finds every published task trained
exactly once, the stream holds no pending entry, and the peak used_memory over the empty server's stayed
under the prediction. Real Redis, a tiny Qwen2 on CPU, one learner process at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
from pathlib import Path

from searchr1.core.schemas import encode
from searchr1.core.settings import load_settings
from searchr1.learner.algo.consumed import decode as decode_consumed
from searchr1.learner.redis_budget import redis_need_bytes
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.tools.audit import audit
from searchr1.learner.tools.audit_sources import read_archive, read_checkpoint, read_logs, read_streams
from searchr1.streams import StreamKeys, trajectories_stream
from tests.support.synthetic import synthetic_group, tiny_qwen2

RUN = "kill3b"
GROUPS_PER_STEP, EVERY, INFLIGHT, STEPS, KILL_AFTER = 4, 3, 4, 9, 4
PROMPT, RESPONSE, GROUP_SIZE, VOCAB = 250, 1400, 5, 256


def _config(tmp_path: Path, url: str, model: Path) -> Path:
    config = tmp_path / "learner.toml"
    config.write_text(f"""
[learner]
device = "cpu"
threads = 1
log_dir = "{tmp_path / 'logs'}"
read_block_ms = 200
lease_ttl_ms = 5000
[learner.redis]
url = "{url}"
run = "{RUN}"
[learner.model]
path = "{model}"
[learner.algorithm]
max_staleness = 100
use_kl_loss = false
[learner.batch]
groups_per_step = {GROUPS_PER_STEP}
micro_batch_size = 5
max_seq_len = 1664
[learner.dispatcher]
enabled = false
group_size = {GROUP_SIZE}
max_inflight = {INFLIGHT}
[learner.weights]
dir = "{tmp_path / 'weights'}"
keep = 1
[learner.checkpoint]
dir = "{tmp_path / 'ckpt'}"
every = {EVERY}
keep = 2
""")
    return config


async def _train(config: Path, log: Path):
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "searchr1.cli", "train", "--config", str(config), "--max-steps", str(STEPS),
            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=out, stderr=out)


class _Feeder:
    """Publishes the groups as rollout workers do (acked entries trimmed at each publish), never more than
    `INFLIGHT` unread ahead of the learner, and samples Redis' used_memory after each publish and every
    50 ms."""

    def __init__(self, redis, groups: list) -> None:
        self.redis = redis
        self.stream = trajectories_stream(redis, StreamKeys(RUN), trim_every=1)
        self.groups = groups
        self.published: list[str] = []
        self.peak = 0

    async def sample(self) -> None:
        self.peak = max(self.peak, int((await self.redis.info("memory"))["used_memory"]))

    async def feed(self, upto: int) -> None:
        while len(self.published) < upto:
            if await self.stream.lag() < INFLIGHT:
                group = self.groups[len(self.published)]
                await self.stream.publish(group)
                self.published.append(group.task.task_id)
                await self.sample()
            else:
                await asyncio.sleep(0.02)

    async def watch(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(0.05)


def _logged_steps(step_log: Path) -> list[int]:
    if not step_log.is_file():
        return []
    return [json.loads(line)["step"] for line in step_log.read_text().splitlines() if line.strip()]


async def _until(predicate, proc, log: Path, what: str) -> None:
    for _ in range(6000):
        if predicate():
            return
        assert proc.returncode is None, f"learner exited {proc.returncode} before {what}: {log.read_text()[-3000:]}"
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {what}: {log.read_text()[-3000:]}")


async def _finish_or_starve(proc, feeder: _Feeder, ckpt: Path, log: Path) -> None:
    """Wait for the learner to exit. Every group is published by now: once all are read and acked while no
    checkpoint covers the last step, the learner waits for groups that will never come, having acked
    groups no checkpoint covers (lost when it restarts): fail then."""
    while proc.returncode is None:
        if await feeder.stream.lag() == 0 and await feeder.stream.pending() == 0:
            last = read_checkpoint(ckpt)
            if last is None or last.step < STEPS:  # acks follow the checkpoint: this is no race
                raise AssertionError(f"every group acked, the last checkpoint at step "
                                     f"{last.step if last else 0} of {STEPS}: {log.read_text()[-3000:]}")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.2)


async def _stop(proc) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_a_learner_killed_between_checkpoints_loses_nothing_and_trains_nothing_twice(
        tmp_path, redis, redis_server):
    model = tiny_qwen2(tmp_path / "model", vocab=VOCAB, hidden=64)
    config = _config(tmp_path, redis_server.url, model)
    predicted = redis_need_bytes(load_settings(LearnerSettings, config))
    rng = random.Random(0)
    groups = [synthetic_group(f"nq-{i}@e0", group_size=GROUP_SIZE, vocab=VOCAB, prompt_len=PROMPT,
                              response_len=RESPONSE, text_per_token=4.2, rng=rng)
              for i in range(STEPS * GROUPS_PER_STEP)]
    feeder = _Feeder(redis, groups)
    await feeder.stream.ensure_group()
    baseline = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", baseline + predicted)  # Redis sized by the run (noeviction)
    watcher = asyncio.create_task(feeder.watch())
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    log, step_log = logs / "learner.log", logs / f"{RUN}.jsonl"
    logs.mkdir()
    proc = None
    try:
        proc = await _train(config, log)
        await asyncio.wait_for(feeder.feed(KILL_AFTER * GROUPS_PER_STEP), 600)
        await _until(lambda: KILL_AFTER in _logged_steps(step_log), proc, log, f"step {KILL_AFTER} logged")
        proc.kill()  # SIGKILL: no handler, no checkpoint, no ack
        await proc.wait()
        # killed holding step 4's groups: unacked, covered by no checkpoint (the last one is step 3's)
        assert read_checkpoint(ckpt).step == EVERY
        assert await feeder.stream.pending() == GROUPS_PER_STEP

        proc = await _train(config, log)
        await asyncio.wait_for(feeder.feed(len(groups)), 600)
        await asyncio.wait_for(_finish_or_starve(proc, feeder, ckpt, log), 600)
        assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await redis.config_set("maxmemory", 0)
        if proc is not None:
            await _stop(proc)
    await feeder.sample()

    text = log.read_text()
    assert f"resumed from step {EVERY}" in text and f"stopped at step {STEPS}" in text, text[-3000:]
    assert _logged_steps(step_log) == [*range(1, KILL_AFTER + 1), *range(EVERY + 1, STEPS + 1)]

    tasks, trajectories, dead, announced = read_streams(redis_server.url, RUN)
    resumes, drops, _workers = read_logs(logs)
    checkpoint = read_checkpoint(ckpt)
    report = audit(tasks, trajectories, dead, read_archive(tmp_path / "archive"), checkpoint,
                   drop_reasons=drops, learner_resumes=resumes, announced_version=announced,
                   dispatch_log=feeder.published)
    summary = report.as_json()
    assert report.ok, summary
    assert report.dispatched == len(groups) == report.trained_once, summary
    assert not (report.lost or report.trained_twice or report.dropped or report.dead or report.in_flight), summary
    assert report.superseded_steps == [KILL_AFTER], summary  # step 4 archived by both learners, kept once
    assert report.learner_resumes == [EVERY] and checkpoint.step == STEPS, summary
    state = json.loads(sorted(ckpt.glob("step*/state.json"))[-1].read_text())
    assert decode_consumed(state) == set(feeder.published)
    assert await feeder.stream.pending() == 0 and await feeder.stream.lag() == 0

    # Redis held the unacked groups of a whole checkpoint interval, and stayed under the prediction
    wire = min(len(encode(g)) for g in groups)  # msgpack bytes of the smallest group
    assert feeder.peak - baseline > GROUPS_PER_STEP * EVERY * wire * 0.9, (feeder.peak - baseline, wire)
    assert feeder.peak - baseline <= predicted, (feeder.peak - baseline, predicted)
