"""`searchr1 audit RUN_DIR` finds the run's name in `RUN_DIR/processes.json`: `up` starts the learner without
`--run` (it goes by environment, as torchrun would read `--run` as its own option), so the name is read from
a rollout worker's command line; a learner template that passes `--run` still wins, and `--redis` is read
from the learner's only."""

from __future__ import annotations

import json
from pathlib import Path

from searchr1.learner.tools.audit_sources import run_identity


def _table(run_dir: Path, **argvs: list[str]) -> None:
    (run_dir / "processes.json").write_text(json.dumps({n.replace("_", "-"): {"pid": 1, "argv": a, "restarts": 0}
                                                         for n, a in argvs.items()}))


def test_the_run_comes_from_a_worker_when_the_learner_has_none(tmp_path: Path):
    _table(tmp_path, learner=["searchr1", "train", "--config", "c.toml", "--metrics-port", "9"],
           rollout_0=["searchr1", "serve", "rollout", "--worker-id", "rollout-0", "--run", "demo"])
    assert run_identity(tmp_path) == ("demo", None)


def test_a_learner_template_with_run_and_redis_wins(tmp_path: Path):
    _table(tmp_path, learner=["searchr1", "train", "--run", "mine", "--redis", "redis://h:1/0"],
           rollout_0=["searchr1", "serve", "rollout", "--run", "other"])
    assert run_identity(tmp_path) == ("mine", "redis://h:1/0")


def test_no_table_no_identity(tmp_path: Path):
    assert run_identity(tmp_path) == (None, None)
    _table(tmp_path, learner=["searchr1", "train"])
    assert run_identity(tmp_path) == (None, None)
