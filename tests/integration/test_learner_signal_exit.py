"""`searchr1 train` stopped by SIGTERM before its last step (a pod evicted, preempted or drained) checkpoints
and exits 143, not 0: a Kubernetes Job counts exit 0 as the run completed and would never resume it. Started
again, it resumes from the checkpoint and exits 0 at its last step. Real Redis, a tiny Qwen2, one process."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys

from searchr1.learner.commands import SIGNALLED_EXIT
from searchr1.streams import StreamKeys, trajectories_stream
from tests.support.synthetic import synthetic_group, tiny_qwen2


async def _train(config, log):
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "searchr1.cli", "train", "--config", str(config), "--max-steps", "2",
            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=out, stderr=out)


async def test_sigterm_before_the_last_step_exits_non_zero_and_resumes(tmp_path, redis, redis_server):
    model = tiny_qwen2(tmp_path / "model", vocab=256, hidden=64)
    groups = trajectories_stream(redis, StreamKeys("sig"))
    await groups.ensure_group()
    rng = random.Random(0)
    await groups.publish_many([synthetic_group(f"t{i}", group_size=4, rng=rng, rewards=[1.0, 0.0, 1.0, 0.0])
                               for i in range(2)])
    ckpt = tmp_path / "ckpt"
    config = tmp_path / "learner.toml"
    config.write_text(f"""
[learner]
device = "cpu"
threads = 1
log_dir = "{tmp_path / 'logs'}"
read_block_ms = 200
[learner.redis]
url = "{redis_server.url}"
run = "sig"
[learner.model]
path = "{model}"
[learner.algorithm]
max_staleness = 100
[learner.batch]
groups_per_step = 2
[learner.dispatcher]
enabled = false
[learner.weights]
dir = "{tmp_path / 'weights'}"
[learner.checkpoint]
dir = "{ckpt}"
""")
    log = tmp_path / "train.log"
    proc = await _train(config, log)
    try:
        for _ in range(1200):  # step 1 trained and checkpointed; it then waits for more groups
            if (ckpt / "step00000001" / "state.json").is_file() or proc.returncode is not None:
                break
            await asyncio.sleep(0.1)
        assert proc.returncode is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert rc == SIGNALLED_EXIT == 143, log.read_text()[-3000:]
    assert "stopped at step 1" in log.read_text()

    await groups.publish_many([synthetic_group(f"t{i}", group_size=4, rng=rng, rewards=[1.0, 0.0, 1.0, 0.0])
                               for i in range(2, 4)])
    proc = await _train(config, log)
    try:
        rc = await asyncio.wait_for(proc.wait(), 240)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert "resumed from step 1" in text and "stopped at step 2" in text
