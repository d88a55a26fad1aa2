"""`searchr1 train` under torchrun with 2 CPU ranks (gloo, FSDP) against a real Redis: rank 0 reads the
groups and broadcasts them, both ranks train, the gathered snapshots are announced and the groups acked."""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path

import pytest

from searchr1.core.servers import free_port
from searchr1.streams import StreamKeys, trajectories_stream
from searchr1.weightsync import fetch_snapshot, latest
from tests.support.synthetic import synthetic_group, tiny_qwen2


@pytest.mark.timeout(300)
async def test_torchrun_two_ranks_train_and_publish(tmp_path, redis, redis_server):
    model = tiny_qwen2(tmp_path / "model", vocab=256, hidden=64)
    keys = StreamKeys("dist")
    producer = trajectories_stream(redis, keys)
    await producer.ensure_group()
    rng = random.Random(0)
    await producer.publish_many([synthetic_group(f"t{i}", group_size=4, rng=rng, rewards=[1.0, 0.0, 1.0, 0.0])
                                 for i in range(4)])
    config = tmp_path / "learner.toml"
    config.write_text(f"""
[learner]
device = "cpu"
threads = 1
log_dir = "{tmp_path / 'logs'}"
read_block_ms = 200
[learner.redis]
url = "{redis_server.url}"
run = "dist"
[learner.model]
path = "{model}"
[learner.algorithm]
max_staleness = 1
[learner.optim]
lr = 1e-3
[learner.batch]
groups_per_step = 2
micro_batch_size = 3
[learner.dispatcher]
enabled = false
[learner.weights]
dir = "{tmp_path / 'weights'}"
[learner.checkpoint]
dir = "{tmp_path / 'ckpt'}"
""")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), "-m", "searchr1.cli", "train", "--config", str(config), "--max-steps", "2"]
    proc = await asyncio.create_subprocess_exec(*cmd, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=280)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    assert "stopped at step 2 (policy version 2)" in text
    wv = await latest(redis, keys)
    assert wv.version == 2
    snap = await fetch_snapshot(wv, tmp_path / "dl")
    assert (snap / "config.json").is_file()
    assert await producer.pending() == 0
    assert (Path(tmp_path / "ckpt") / "step00000002" / "state.json").is_file()
    assert (tmp_path / "logs" / "dist.jsonl").read_text().count("\n") == 2
