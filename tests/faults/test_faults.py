"""Kill anything mid-run and lose nothing: during a tiny-world run under `searchr1 up`, one process is killed
with SIGKILL — the learner, one rollout worker of two, the retriever, the reward service or Redis, each at
a seeded random moment, and the learner and a worker at their worst moments (fault points) — the launcher
restarts it, the run reaches its step target, and the delivery audit (`searchr1 audit`) finds no task lost
and none trained twice, the learner resumed from its last checkpoint, and every worker on the final
weight version. Each case prints the audit table and its time to recover.

The learner case runs with the default suite; the others with `-m faults` (`make test-faults`)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.faults.harness import LEARNER_STEPS, STEPS, FaultRun, describe, run_config, table_row


def _start(tmp_path: Path, world: Path, steps: int, **env) -> FaultRun:
    run = FaultRun(tmp_path, run_config(tmp_path, world, steps=steps, **env), steps)
    run.start()
    return run


def _finish_and_audit(run: FaultRun) -> dict:
    """Wait for the run's end; print the faults and the audit table; check the promise."""
    try:
        code = run.finish()
    finally:
        run.stop()
    out = run.output()
    assert code == 0, out[-6000:]
    steps = run.target_steps
    assert run.steps() == steps, out[-6000:]
    figures, table = run.audit()
    print(table)
    for fault in run.faults:
        print(describe(fault))
    print("table row:", table_row(run, figures))
    assert figures["lost"] == 0, (figures["lost_ids"], table)
    assert figures["trained_twice"] == 0, (figures["trained_twice_ids"], table)
    assert figures["ok"], table
    assert figures["trained_once"] >= steps, table  # every step trains at least one group
    assert figures["checkpoint_step"] == figures["last_trained_step"] == steps, table
    assert set(figures["worker_versions"]) == {"rollout-0", "rollout-1"}, table
    assert figures["workers_on_final_version"], table
    for fault in run.faults:
        assert fault.healthy_after_s is not None, describe(fault)
    return figures


def _kill_case(tmp_path: Path, world: Path, target: str, seed: int) -> dict:
    rng = random.Random(seed)
    run = _start(tmp_path, world, LEARNER_STEPS if target == "learner" else STEPS)
    try:
        fault = run.kill(target, after_step=rng.randint(1, 2), rng=rng)
    except BaseException:
        run.stop()
        raise
    figures = _finish_and_audit(run)
    if target == "learner":
        assert figures["learner_resumes"] == [fault.checkpoint_at_kill], figures
    return figures


@pytest.mark.timeout(1200)
def test_learner_killed_at_a_random_moment(tmp_path, fault_world):
    _kill_case(tmp_path, fault_world, "learner", seed=0)


@pytest.mark.faults
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("target, seed", [("rollout-1", 1), ("retriever", 2), ("reward", 3)])
def test_service_killed_at_a_random_moment(tmp_path, fault_world, target, seed):
    figures = _kill_case(tmp_path, fault_world, target, seed)
    assert figures["learner_resumes"] == []  # the learner never restarted


@pytest.mark.faults
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("point", ["learner.after_archive@3", "learner.after_checkpoint@3",
                                   "checkpoint.before_seal@3"])
def test_learner_killed_between_train_and_ack(tmp_path, fault_world, point):
    marker = tmp_path / "fault.fired"
    run = _start(tmp_path, fault_world, LEARNER_STEPS,
                 learner_env={"SEARCHR1_FAULT_POINT": point, "SEARCHR1_FAULT_MARKER": str(marker)})
    try:
        fault = run.fault_point("learner", marker)
    except BaseException:
        run.stop()
        raise
    figures = _finish_and_audit(run)
    # after_archive: step 3 archived, checkpoint 2 the last → resumed from 2, step 3 archived again;
    # after_checkpoint: checkpoint 3 written, its groups unacked → resumed from 3, the groups acked as replays;
    # before_seal (a torn checkpoint): checkpoint 3 half-written → resumed from 2, step 3 archived again
    expected = 3 if point.startswith("learner.after_checkpoint") else 2
    assert figures["learner_resumes"] == [expected], figures
    assert figures["superseded_steps"] == ([3] if expected == 2 else []), figures
    assert fault.healthy_after_s is not None


@pytest.mark.faults
@pytest.mark.timeout(1200)
def test_worker_killed_between_publish_and_ack(tmp_path, fault_world):
    marker = tmp_path / "fault.fired"
    run = _start(tmp_path, fault_world, STEPS, rollout_env={"SEARCHR1_FAULT_POINT": "rollout.after_publish@3",
                                                     "SEARCHR1_FAULT_MARKER": str(marker)})
    try:
        fault = run.fault_point(_fired_worker(run, marker), marker)
    except BaseException:
        run.stop()
        raise
    figures = _finish_and_audit(run)
    assert figures["learner_resumes"] == [], figures
    assert fault.healthy_after_s is not None


def _fired_worker(run: FaultRun, marker: Path) -> str:
    """Which worker's fault point fired (the marker names its pid)."""
    run.wait(marker.is_file, 900, "the worker's fault point to fire")
    pid = int(marker.read_text().split(" pid ")[1].split()[0])
    import json

    table = json.loads((run.run_dir / "processes.json").read_text())
    for name in ("rollout-0", "rollout-1"):
        if table[name]["pid"] == pid:
            return name
    # already restarted: the restart record names it
    for line in (run.run_dir / "restarts.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["name"].startswith("rollout-"):
            return record["name"]
    raise AssertionError(f"no worker had pid {pid}")


@pytest.mark.faults
@pytest.mark.timeout(1200)
def test_redis_killed_at_a_random_moment(tmp_path, fault_world):
    _kill_case(tmp_path, fault_world, "redis", seed=4)
