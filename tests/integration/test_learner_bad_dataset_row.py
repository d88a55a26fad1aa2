"""`searchr1 train` with a dataset row the wire `Task` refuses — a question over 16,384 characters, the
500th row of 600 — stops at start with exit 2 and one line naming the file, the row and the field; nothing
is dispatched (real Redis, a tiny model). The dispatcher would otherwise have stopped on that row the
first time it came up, with the learner waiting on its tasks. The dataset is read before the model loads:
the model directory here has a config.json and nothing to load, and the refusal is still the dataset's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from searchr1.streams import StreamKeys


def test_train_refuses_a_dataset_with_a_row_the_wire_refuses(tmp_path, redis_server):
    model = tmp_path / "model"  # passes the command's check (a config.json), never loaded: the dataset is refused first
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    rows = [{"task_id": f"q{i}", "question": f"question {i}?", "golden_answers": ["a"]} for i in range(600)]
    rows[499]["question"] = "x" * 16_385
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "run.toml"
    config.write_text(f"""
[learner]
device = "cpu"
log_dir = "{tmp_path / 'logs'}"
model = {{ path = "{model}" }}
redis = {{ url = "{redis_server.url}", run = "badrow" }}
checkpoint = {{ dir = "{tmp_path / 'ckpt'}" }}
weights = {{ dir = "{tmp_path / 'weights'}" }}
dispatcher = {{ dataset = "{dataset}", group_size = 2 }}
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEARNER_")}
    proc = subprocess.run([sys.executable, "-m", "searchr1.cli", "train", "--config", str(config)],
                          capture_output=True, text=True, env=env, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert errors == [f"error: {dataset}: row 499 (task id 'q499'): question: String should have at most 16384 "
                      "characters"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr

    import redis as sync_redis

    client = sync_redis.Redis.from_url(redis_server.url)
    assert client.xlen(StreamKeys("badrow").tasks) == 0  # nothing dispatched
