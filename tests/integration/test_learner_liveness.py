"""`searchr1 train` never waits with green probes (real Redis, a tiny model, the real command):

- the dispatcher dies — its durable dispatch record cannot be written (ENOSPC: the record is /dev/full) —
  and the learner stops at once, exit 1, naming the dispatcher and the error, instead of waiting for
  groups of tasks nobody publishes;
- no rollout worker takes the tasks: the step cannot fill, nothing is progress, and past `stall_timeout_s`
  the learner stops, exit 1, naming what it waited for (the tasks queued, the groups read), after its
  `/healthz` turned 503 and `searchr1_learner_progress_age_seconds` passed half the bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from searchr1.core.servers import free_port
from tests.support.synthetic import tiny_qwen2


def _config(tmp_path: Path, redis_url: str, run: str, *, stall_s: float = 1800.0, metrics_port: int = 0) -> Path:
    model = tiny_qwen2(tmp_path / "model", vocab=256, hidden=64)
    rows = [{"task_id": f"q{i}", "question": f"question {i}?", "golden_answers": ["a"]} for i in range(20)]
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "run.toml"
    config.write_text(f"""
[learner]
device = "cpu"
threads = 1
log_dir = "{tmp_path / 'logs'}"
stall_timeout_s = {stall_s}
metrics_port = {metrics_port}
read_block_ms = 200
model = {{ path = "{model}" }}
redis = {{ url = "{redis_url}", run = "{run}" }}
checkpoint = {{ dir = "{tmp_path / 'ckpt'}" }}
weights = {{ dir = "{tmp_path / 'weights'}" }}
batch = {{ groups_per_step = 2 }}
algorithm = {{ max_staleness = 0 }}
dispatcher = {{ dataset = "{dataset}", group_size = 2 }}
""")
    return config


def _train(config: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEARNER_")}
    return subprocess.Popen([sys.executable, "-m", "searchr1.cli", "train", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_dispatcher_that_dies_stops_the_learner_with_its_cause(tmp_path, redis_server):
    config = _config(tmp_path, redis_server.url, "enospc")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "enospc.dispatched").symlink_to("/dev/full")  # every write: No space left on device
    proc = _train(config)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == ["error: learner: background task 'dispatcher' died (OSError: [Errno 28] No space left on "
                      "device); stopping the service"], err[-3000:]


def test_a_step_that_cannot_fill_ends_in_a_stop_naming_what_it_waited_for(tmp_path, redis_server):
    port = free_port()
    config = _config(tmp_path, redis_server.url, "nobody", stall_s=8.0, metrics_port=port)
    proc = _train(config)
    t0 = time.monotonic()
    seen_503 = age = bound = None
    while proc.poll() is None and time.monotonic() - t0 < 300:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
        except urllib.error.HTTPError as exc:
            seen_503 = seen_503 or exc.code == 503
        except OSError:
            pass
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("searchr1_learner_progress_age_seconds "):
                        age = max(age or 0.0, float(line.split()[1]))
                    elif line.startswith("searchr1_learner_stall_timeout_seconds "):
                        bound = float(line.split()[1])
        except OSError:
            pass
        time.sleep(0.3)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err[-3000:]
    assert errors[0].startswith("error: learner: background task 'progress watchdog' died (Stalled: learner: no "
                                "progress for "), errors
    assert ("(stall_timeout_s 8): waiting for the groups of step 1: 0 of 2 read; 2 task(s) queued or in rollout, "
            "0 group(s) unread; dispatcher budget 0); stopping the service") in errors[0], errors
    assert bound == 8.0 and age is not None and age > 4.0
    assert seen_503 is not False
