"""Faults that are not a death, under `searchr1 up` as in test_faults.py, each ending with the delivery
audit (nothing lost, nothing trained twice — within a step too): a group delivered twice with a
visibility timeout of 1 ms (forced second reads within a step), a partition that black-holes one worker's
or the learner's Redis connection, a second learner started against the run, a poison group,
and windows in which Redis refuses writes (`OOM`, `MISCONF`)."""

from __future__ import annotations

import json
import random
import re
import time
import urllib.request
from pathlib import Path

import pytest

from searchr1.core.faults import POISON_TOKEN_ID
from searchr1.streams import StreamKeys
from tests.faults.harness import LEARNER_STEPS, Fault, FaultRun, run_config
from tests.faults.test_faults import _finish_and_audit
from tests.faults.windows import (
    ThreadedProxy,
    free_port,
    free_port_block,
    inject_copy,
    metrics_port,
    redis_client,
    refuse_writes,
    second_learner,
    window,
)

WORKER_STEPS = 40
"""A partitioned worker's run: steps enough for it to come back and load the final weights (the other
worker trains about a step a second meanwhile, and the partitioned one's calls wait out their 30 s reply
timeout)."""
PARTITION_S = {"rollout-0": 15.0, "learner": 10.0}
"""How long the partition lasts. The learner's is shorter than the 12 s its lease survives whenever the
partition begins (renewals every 10 s, retried every 6 s, the local view valid for 24 s)."""
SECOND_LEARNER_STEPS = 40
"""Steps enough for the first learner to be still training when the second one has started (about a step
a second here; the second learner's start takes tens of seconds)."""


def _start(tmp_path: Path, world: Path, steps: int, **kwargs) -> FaultRun:
    run = FaultRun(tmp_path, run_config(tmp_path, world, steps=steps, **kwargs), steps)
    run.start()
    return run


def _redis_env(kind: str, redis_url: str) -> dict[str, dict[str, str]]:
    """The Redis URL of the `kind` processes (through a proxy), as `[launcher.<kind>] env`: the launcher
    gives the URL by environment, with `{redis_password}` for the password of the Redis it starts."""
    return {f"{kind}_env": {f"{kind.upper()}_REDIS__URL": redis_url}}


def _env_of(run: FaultRun, name: str) -> str:
    """The environment of a process of the run (`/proc/PID/environ`, same user), one line per variable."""
    return Path(f"/proc/{run.pid(name)}/environ").read_bytes().replace(b"\0", b"\n").decode(errors="replace")


def _learner_metric(run: FaultRun, name: str, labels: str) -> float:
    port = metrics_port(run, "learner")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _restarts(run: FaultRun) -> list[str]:
    path = run.run_dir / "restarts.jsonl"
    return [json.loads(line)["name"] for line in path.read_text().splitlines()] if path.is_file() else []


def _logs_mention(run: FaultRun, text: str) -> list[str]:
    return sorted(p.stem for p in (run.run_dir / "logs").glob("*.log") if text in p.read_text(errors="replace"))


@pytest.mark.faults
@pytest.mark.timeout(1200)
def test_duplicate_within_step(tmp_path, fault_world):
    """A visibility timeout of 1 ms, checkpoints every 2 steps, and copies of published groups (a publish
    applied twice): each copy is set aside as a replay, which makes its step read again, with the groups it
    holds idle past the timeout. None is reclaimed into the same step: trained twice stays 0."""
    run = _start(tmp_path, fault_world, LEARNER_STEPS, learner_env={
        "LEARNER_VISIBILITY_TIMEOUT_MS": "1", "LEARNER_CHECKPOINT__EVERY": "2"})
    try:
        for after in (1, 3):
            run.wait(lambda a=after: run.steps() >= a, 900, f"step {after}")
            before = _learner_metric(run, "searchr1_learner_groups_dropped_total", 'reason="replay"')
            fault = Fault("learner", f"a group published twice after step {after} (visibility timeout 1 ms)")
            fault.killed_at = time.time()
            steps_then = run.steps()
            tid = inject_copy(redis_client(run), "faults", lambda g: g)
            run.wait(lambda b=before: _learner_metric(run, "searchr1_learner_groups_dropped_total",
                                                      'reason="replay"') > b, 300, f"the copy of {tid} set aside")
            fault.healthy_after_s = time.time() - fault.killed_at
            run.wait(lambda s=steps_then: run.steps() > s, 300, "the next step")
            fault.next_step_after_s = time.time() - fault.killed_at
            run.faults.append(fault)
    except BaseException:
        run.stop()
        raise
    figures = _finish_and_audit(run)
    assert figures["learner_resumes"] == [], figures
    assert _restarts(run) == []


@pytest.mark.faults
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("target", ["rollout-0", "learner"])
def test_partition_black_holes_redis(tmp_path, fault_world, target):
    """The target's Redis connection goes through a proxy that stops forwarding without closing anything
    (`PARTITION_S`): its `/readyz` turns 503, and it goes on once packets flow again, never restarted
    (the learner keeps its lease); nothing is lost."""
    rng = random.Random(5)
    redis_port = free_port()
    proxies: list[ThreadedProxy] = []
    if target == "learner":
        proxies.append(ThreadedProxy(redis_port, free_port()))
        url, steps = f"redis://:{{redis_password}}@127.0.0.1:{proxies[0].proxy.port}/0", LEARNER_STEPS
    else:  # worker i's proxy listens on f"{prefix}{i}": only rollout-0's is black-holed
        prefix = free_port_block(rng)
        proxies += [ThreadedProxy(redis_port, prefix * 10), ThreadedProxy(redis_port, prefix * 10 + 1)]
        url, steps = f"redis://:{{redis_password}}@127.0.0.1:{prefix}{{worker_index}}/0", WORKER_STEPS
    kind = "learner" if target == "learner" else "rollout"
    try:
        run = _start(tmp_path, fault_world, steps, redis_port=redis_port, **_redis_env(kind, url))
        try:
            hold = PARTITION_S[target]
            fault = window(run, target, f"its Redis connection black-holed for {hold:.0f} s",
                           proxies[0].blackhole, proxies[0].restore, after_step=1, hold_s=hold, watch=target)
            assert f"@127.0.0.1:{proxies[0].proxy.port}/0" in _env_of(run, target)  # it was partitioned
        except BaseException:
            run.stop()
            raise
        figures = _finish_and_audit(run)
    finally:
        for p in proxies:
            p.close()
    assert fault.not_ready_seen, "the partitioned process stayed ready"
    # the learner keeps its lease through the partition (its renewals are retried on new connections)
    assert _restarts(run) == [] and figures["learner_resumes"] == [], (_restarts(run), figures)


@pytest.mark.faults
@pytest.mark.timeout(1200)
def test_second_learner_refused(tmp_path, fault_world):
    """A second `searchr1 train` against the running run exits with the lease error naming the holder;
    the first keeps training and is never restarted."""
    run = _start(tmp_path, fault_world, SECOND_LEARNER_STEPS)
    second = None
    try:
        run.wait(lambda: run.steps() >= 1, 900, "step 1")
        holder = run.pid("learner")
        fault = Fault("learner", "a second learner started on the run after step 1")
        fault.killed_at = time.time()
        steps_then = run.steps()
        kwargs = redis_client(run).connection_pool.connection_kwargs
        second = second_learner(run, run.config, f"redis://:{kwargs['password']}@127.0.0.1:{kwargs['port']}/0")
        deadline = time.monotonic() + 300
        while second.poll() is None and time.monotonic() < deadline:  # the first learner trains on meanwhile
            if fault.next_step_after_s is None and run.steps() > steps_then:
                fault.next_step_after_s = time.time() - fault.killed_at
            time.sleep(0.2)
        assert second.poll() is not None, "the second learner neither refused nor stopped"
        assert run.steps() < SECOND_LEARNER_STEPS and run.proc.poll() is None, "the run ended first"
        fault.healthy_after_s = time.time() - fault.killed_at  # the second one refused and gone
        out, err = ((run.root / f"second-learner.{x}").read_text() for x in ("out", "err"))
        run.faults.append(fault)
        assert second.returncode == 3, out + err
        assert "another learner holds run's lease" in err, err
        assert f":{holder}/" in err, (holder, err)
        print("second learner:", err.strip().splitlines()[-1])
        if fault.next_step_after_s is None:
            run.wait(lambda: run.steps() > steps_then, 300, "the next step")
            fault.next_step_after_s = time.time() - fault.killed_at
        assert run.pid("learner") == holder
    except BaseException:
        run.stop()
        raise
    finally:
        if second is not None and second.poll() is None:
            second.kill()
            second.wait()
    figures = _finish_and_audit(run)
    assert figures["learner_resumes"] == [] and _restarts(run) == []
    assert not (run.root / "second-learner" / "checkpoints").exists()


@pytest.mark.faults
@pytest.mark.timeout(1200)
def test_poison_group(tmp_path, fault_world):
    """A worker publishes one group with a token id far past the vocabulary (the `rollout.poison_group`
    test hook, its 3rd group): its task carries the policy's vocabulary size, so the schema refuses it
    when the learner reads it and the trajectories stream dead-letters it alone with its reason; its task
    is replaced, the lockstep step that counted on it trains, nothing restarts; the audit finds it
    dead-lettered."""
    marker = tmp_path / "fault.fired"
    run = _start(tmp_path, fault_world, LEARNER_STEPS, rollout_env={
        "SEARCHR1_FAULT_POINT": "rollout.poison_group@3", "SEARCHR1_FAULT_MARKER": str(marker)})
    try:
        run.wait(marker.is_file, 900, "the poison group")
        fault = Fault("rollout", "a poison group (its 3rd)")
        fault.killed_at = marker.stat().st_mtime
        steps_then = run.steps()
        r = redis_client(run)
        reasons = run.wait(lambda: [f[b"reason"].decode() for _, f in r.xrange(StreamKeys("faults").dead)], 300,
                           "the dead letter")
        fault.healthy_after_s = time.time() - fault.killed_at  # dead-lettered
        run.wait(lambda: run.steps() > steps_then, 300, "the next step")
        fault.next_step_after_s = time.time() - fault.killed_at
        run.faults.append(fault)
        assert len(reasons) == 1 and f"= {POISON_TOKEN_ID} is outside the vocabulary" in reasons[0], reasons
    except BaseException:
        run.stop()
        raise
    figures = _finish_and_audit(run)
    assert figures["learner_resumes"] == [] and _restarts(run) == []
    assert figures["dead_lettered"] == 1 and len(figures["dead_reasons"]) == 1, figures
    assert "outside the vocabulary" in next(iter(figures["dead_reasons"])), figures


@pytest.mark.faults
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("kind", ["oom", "misconf"])
def test_redis_refuses_writes(tmp_path, fault_world, kind):
    """Redis refuses writes for 15 s (`OOM`: `maxmemory` 1 byte with `noeviction`; `MISCONF`: a failed
    background save with `stop-writes-on-bgsave-error`): the services wait, log the refusal, and go on;
    nothing restarts, nothing is lost."""
    run = _start(tmp_path, fault_world, LEARNER_STEPS)
    try:
        run.wait(lambda: run.steps() >= 1, 900, "step 1")
        begin, end = refuse_writes(redis_client(run), kind)
        window(run, "redis", f"refusing writes ({kind.upper()}) for 15 s", begin, end, after_step=1,
               hold_s=15.0, watch="learner")
    except BaseException:
        run.stop()
        raise
    figures = _finish_and_audit(run)
    assert _restarts(run) == [] and figures["learner_resumes"] == []
    waited = _logs_mention(run, f"redis refuses writes ({kind})")
    print("waited through the refusal:", waited)
    assert waited, "no process met the refusal"
