"""A SIGTERM'd learner under torchrun finishes the step in hand (and its checkpoint) when torchrun's
shutdown timeout is the grace computed from the config, and is killed mid-step when it is shorter.

Two gloo ranks on CPU (`python -m searchr1.learner.torchrun`, as searchr1 up, compose and Kubernetes start
them), a real Redis, a tiny Qwen2; the steps after the first take SLOW_S seconds longer
(tests/support/slow_step: a sleep after training on every rank, standing in for a GPU step of minutes).
SIGTERM reaches torchrun while step 2, a checkpoint step, is being trained:

- with `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` = the grace `searchr1.learner.stop_budget` gives the config (its
  tiny step estimate plus the exit allowance, rounded up to a minute), rank 0 reports `stopped at step 2`
  and step 2's checkpoint is on disk;
- with 2 s, torchrun kills the ranks mid-sleep: no step 2, no checkpoint of it.

On torch 2.12 and later torchrun reads the variable itself; on older releases (the cu129 route's 2.10:
`make test-route-cu129`) `searchr1.learner.torchrun` applies it, and the same assertions hold.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path

import pytest

from searchr1.core.servers import free_port
from searchr1.core.settings import load_settings
from searchr1.streams import StreamKeys, trajectories_stream
from tests.support.synthetic import synthetic_group, tiny_qwen2

ROOT = Path(__file__).resolve().parents[2]
SLOW_S = 25.0


def _config(tmp_path: Path, redis_url: str, model: Path, run: str) -> Path:
    config = tmp_path / f"{run}.toml"
    config.write_text(f"""
[learner]
device = "cpu"
threads = 1
log_dir = "{tmp_path / run / 'logs'}"
read_block_ms = 200
[learner.redis]
url = "{redis_url}"
run = "{run}"
[learner.model]
path = "{model}"
[learner.algorithm]
max_staleness = 100
[learner.batch]
groups_per_step = 2
micro_batch_size = 4
max_seq_len = 256
[learner.dispatcher]
enabled = false
group_size = 4
[learner.weights]
dir = "{tmp_path / run / 'weights'}"
[learner.checkpoint]
dir = "{tmp_path / run / 'ckpt'}"
every = 2
""")
    return config


async def _stop_mid_step(config: Path, timeout_s: int, log: Path) -> str:
    """Start the learner under torchrun, SIGTERM it a few seconds into step 2; its whole output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SLOW_STEP_S": str(SLOW_S),
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(timeout_s),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests/support/slow_step"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "searchr1.learner.torchrun", "--nproc_per_node", "2", "--master_port",
           str(free_port()), "-m", "searchr1.cli", "train", "--config", str(config), "--max-steps", "3"]
    proc = await asyncio.create_subprocess_exec(*cmd, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while True:
            raw = await asyncio.wait_for(proc.stdout.readline(), timeout=300)
            if not raw:
                break
            lines.append(raw.decode(errors="replace"))
            if "step 1:" in lines[-1]:  # step 2's groups are in Redis: it starts at once and sleeps SLOW_S
                await asyncio.sleep(4)
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = await asyncio.wait_for(proc.communicate(), timeout=SLOW_S + 120)
        lines.append(rest.decode(errors="replace"))
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.write_text("".join(lines))
    assert proc.returncode != 0, "torchrun exits non-zero when stopped by a signal"
    return "".join(lines)


@pytest.mark.timeout(600)
async def test_the_computed_grace_lets_the_step_in_hand_finish_and_a_short_one_does_not(tmp_path, redis,
                                                                                         redis_server):
    from searchr1.learner.settings import LearnerSettings
    from searchr1.learner.stop_budget import stop_budget

    model = tiny_qwen2(tmp_path / "model", vocab=256, hidden=64)
    rng = random.Random(0)
    outcomes = {}
    for run in ("grace", "short"):
        stream = trajectories_stream(redis, StreamKeys(run))
        await stream.ensure_group()
        await stream.publish_many([synthetic_group(f"{run}{i}", group_size=4, rng=rng, rewards=[1.0, 0.0, 1.0, 0.0])
                                   for i in range(6)])
        config = _config(tmp_path, redis_server.url, model, run)
        grace = stop_budget(load_settings(LearnerSettings, config), ranks=2, gpu=False)
        timeout_s = grace.total_s if run == "grace" else 2
        if run == "grace":
            assert grace.total_s >= SLOW_S + 10, grace.explain()  # the computed grace covers this step
        outcomes[run] = await _stop_mid_step(config, timeout_s, tmp_path / f"{run}.log")

    text = outcomes["grace"]
    assert "stopped at step 2" in text, text[-4000:]
    assert (tmp_path / "grace/ckpt/step00000002/state.json").is_file(), text[-4000:]
    assert "forcefully exiting via Signals.SIGKILL" not in text

    text = outcomes["short"]
    assert "stopped at step 2" not in text and "stopped at step" not in text, text[-4000:]
    assert not (tmp_path / "short/ckpt/step00000002").exists()
