"""The fault-injection harness: a tiny-world run under `searchr1 up` (real Redis with its append-only file,
the real retriever on a BM25 index, the real reward service, two rollout workers, the learner), one fault
injected into it, and the delivery audit (`searchr1 audit`) once it has finished.

A fault is either a `kill -9` from outside at a seeded random moment (after the learner's step `after_step`,
plus a random fraction of a second), or a fault point inside the process (`searchr1.core.faults`: the
process's command arms its hook from `SEARCHR1_FAULT_POINT`/`SEARCHR1_FAULT_MARKER` in the environment the
harness gives it, and the process kills itself at the worst moment, once). The harness measures the time to recover: from the kill to
the process being healthy again (the launcher's `RUN_DIR/restarts.jsonl`) and to the next training step
logged after that.

The rollout workers use the transformers engine (seconds to start, where vLLM's CPU start-up takes
minutes on a shared machine): the faults are about processes and streams, not about the engine.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.processes import pid_alive

ROOT = Path(__file__).resolve().parents[2]
WARMSTART = ROOT / "assets" / "tiny-world" / "warmstart"
SEARCHR1 = [sys.executable, "-m", "searchr1.cli"]
STEPS = 30
"""The run's step target when a service other than the learner is killed: the run goes on without it (a
worker fewer, searches or scores failing), so it needs steps enough to outlast the restart (up to a minute
of start-up on a shared machine) and use the restarted service again."""
LEARNER_STEPS = 6
"""The step target when the learner is killed: the run waits for it, so a few steps after the fault do."""


def build_world(out: Path) -> Path:
    """A small tiny world (corpus + train questions; no model: the committed warm start is used)."""
    from tests.support.world import SMALL_WORLD_TOML

    cfg = out.parent / "small-world.toml"
    cfg.write_text(SMALL_WORLD_TOML)
    subprocess.run([*SEARCHR1, "world", "build", "--out", str(out), "--no-model", "--config", str(cfg)],
                   check=True, capture_output=True, timeout=600)
    return out


def run_config(root: Path, world: Path, *, steps: int = STEPS, learner_env: dict[str, str] | None = None,
               rollout_env: dict[str, str] | None = None, extra_toml: str = "", redis_port: int = 0) -> Path:
    """The run config: two workers, small groups, every step checkpointed, short visibility timeouts (a
    dead consumer's entries are reclaimed within seconds) and quick restarts. Redis fsyncs its
    append-only file every second, as in docker-compose.yml and the Kubernetes manifests (a `kill -9` of
    Redis loses nothing either way: its writes are in the page cache before it answers; only a host crash
    can lose the last second). `extra_toml` is appended (tables the config does not already have)."""
    def env(table: dict[str, str] | None) -> str:
        return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in (table or {}).items()) + " }"

    cfg = root / f"faults-{steps}.toml"
    cfg.write_text(textwrap.dedent(f"""
        [launcher]
        run = "faults"
        run_dir = "{root / 'run'}"
        grace_period_s = 10.0

        [launcher.redis]
        appendfsync = "everysec"
        port = {redis_port}

        [launcher.restart]
        backoff_initial_s = 0.5
        jitter_s = 0.5

        [launcher.retriever]
        index_dir = "{root / 'run' / 'index'}"
        corpus = "{world / 'corpus.jsonl'}"
        health_timeout_s = 300.0

        [launcher.reward]
        health_timeout_s = 300.0

        [launcher.rollout]
        workers = 2
        health_timeout_s = 600.0
        env = {env(rollout_env)}

        [launcher.learner]
        health_timeout_s = 600.0
        env = {env(learner_env)}

        [launcher.status]
        refresh_s = 2.0
        plain_interval_s = 20.0

        [retriever]
        torch_threads = 1
        faiss_threads = 1

        [reward]
        workers = 1

        [rollout]
        model = "{WARMSTART}"

        [rollout.engine]
        kind = "hf"
        dtype = "float32"
        max_model_len = 2048
        hf_threads = 1

        [rollout.agent]
        max_turns = 2
        max_tokens_per_turn = 48
        max_obs_tokens = 128
        max_response_tokens = 256

        [rollout.reward]
        scorer = "searchr1_em"
        item_format = "solution_str"

        [rollout.tasks]
        max_concurrent = 4
        visibility_timeout_ms = 15000
        reclaim_interval_s = 1.0
        trim_acked_every = 0

        [rollout.weights]
        poll_interval_s = 0.5
        download_dir = "{root / 'run' / 'rollout-weights'}"

        [learner]
        device = "cpu"
        threads = 1
        seed = 0
        visibility_timeout_ms = 5000
        read_block_ms = 500

        [learner.model]
        path = "{WARMSTART}"

        [learner.algorithm]
        advantage = "grpo"
        max_staleness = 0

        [learner.optim]
        lr = 1e-4
        total_steps = {steps}

        [learner.batch]
        groups_per_step = 2

        [learner.dispatcher]
        dataset = "{world / 'train.parquet'}"
        group_size = 2
        seed = 0
        """) + textwrap.dedent(extra_toml))
    return cfg


@dataclass
class Fault:
    """One injected fault and how the run recovered from it."""

    target: str
    how: str
    killed_at: float = 0.0
    checkpoint_at_kill: int | None = None
    healthy_after_s: float | None = None
    next_step_after_s: float | None = None
    healed_after_s: float | None = None
    """A window fault (a partition, Redis refusing writes): when it ended, from its start."""
    not_ready_seen: bool | None = None
    """A window fault: whether the target's `/readyz` answered 503 during it."""


@dataclass
class FaultRun:
    """One `searchr1 up` of the fault config, started in `root`."""

    root: Path
    config: Path
    target_steps: int
    proc: subprocess.Popen | None = None
    faults: list[Fault] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def out_path(self) -> Path:
        return self.root / "launcher.out"

    def start(self, env: dict[str, str] | None = None) -> None:
        """Start `searchr1 up`; `env` is added to its environment (and so its services')."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        env.pop("LAUNCHER_RUN_DIR", None)
        with self.out_path.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "searchr1.launcher", "--config", str(self.config)],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                                         start_new_session=True)

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.is_file() else ""

    def steps(self) -> int:
        """Training steps logged so far (the learner's JSONL step log)."""
        path = self.run_dir / "learner" / "faults.jsonl"
        if not path.is_file():
            return 0
        steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
        return max(steps, default=0)

    def pid(self, name: str) -> int:
        return json.loads((self.run_dir / "processes.json").read_text())[name]["pid"]

    def wait(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the launcher exited ({self.proc.returncode}) waiting for {what}:\n"
                                     f"{self.output()[-5000:]}")
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.output()[-5000:]}")

    def latest_checkpoint(self) -> int | None:
        from searchr1.learner.tools.audit_sources import read_checkpoint

        ck = read_checkpoint(self.run_dir / "checkpoints")
        return None if ck is None else ck.step

    def kill(self, target: str, after_step: int, rng: random.Random) -> Fault:
        """`kill -9` `target` once the learner has logged `after_step`, a random fraction of a second
        later; then wait for it to be restarted and healthy, and for the next step."""
        self.wait(lambda: self.steps() >= after_step, 900, f"step {after_step}")
        time.sleep(rng.uniform(0.0, 1.5))
        fault = Fault(target, f"kill -9 after step {after_step}")
        pid = self.pid(target)
        fault.killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        if target == "learner":
            self.wait(lambda: not pid_alive(pid), 30, "the learner to be gone")
            fault.checkpoint_at_kill = self.latest_checkpoint()
        self._recovered(fault)
        return fault

    def fault_point(self, target: str, marker: Path) -> Fault:
        """A fault point fired inside `target` (its process kills itself; `marker` records when)."""
        self.wait(marker.is_file, 900, f"the fault point of {target} to fire")
        fault = Fault(target, marker.read_text().split(" pid ")[0])
        fault.killed_at = marker.stat().st_mtime
        if target == "learner":
            self.wait(lambda: self._restarted(target) is not None or self.proc.poll() is not None, 120,
                      "the learner's restart")
        self._recovered(fault)
        return fault

    def _restarted(self, target: str) -> dict | None:
        path = self.run_dir / "restarts.jsonl"
        if not path.is_file():
            return None
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if (record["name"] == target and record["healthy_at"] is not None
                    and record["died_at"] >= self.faults_cutoff(target)):
                return record
        return None

    def faults_cutoff(self, target: str) -> float:
        return max((f.killed_at for f in self.faults if f.target == target), default=0.0) - 5.0

    def _recovered(self, fault: Fault) -> None:
        self.faults.append(fault)
        record = self.wait(lambda: self._restarted(fault.target), 600, f"{fault.target} restarted and healthy")
        fault.healthy_after_s = record["healthy_at"] - fault.killed_at
        steps_then = self.steps()
        if steps_then >= self.target_steps:
            return
        self.wait(lambda: self.steps() > steps_then or self.proc.poll() is not None, 600, "the next step")
        fault.next_step_after_s = time.time() - fault.killed_at

    def finish(self, timeout: float = 900) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=60)
            raise AssertionError(f"the run did not finish within {timeout:.0f}s:\n{self.output()[-5000:]}") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def audit(self) -> tuple[dict, str]:
        """`searchr1 audit RUN_DIR`: the JSON figures and the table."""
        figures = subprocess.run([*SEARCHR1, "audit", str(self.run_dir), "--json"], capture_output=True,
                                 text=True, timeout=300)
        table = subprocess.run([*SEARCHR1, "audit", str(self.run_dir)], capture_output=True, text=True,
                               timeout=300, env={**os.environ, "COLUMNS": "120"})
        assert figures.stdout.strip().startswith("{"), figures.stdout + figures.stderr
        return json.loads(figures.stdout), table.stdout + table.stderr


def describe(fault: Fault) -> str:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}s"

    window = "" if fault.healed_after_s is None else (
        f"ended after {s(fault.healed_after_s)}, not ready during it: {fault.not_ready_seen}, ")
    return (f"fault: {fault.target} ({fault.how}): {window}healthy again after {s(fault.healthy_after_s)}, "
            f"next step after {s(fault.next_step_after_s)}")


def table_row(run: FaultRun, figures: dict) -> str:
    """The case's row of the table in docs/reliability.md ("Fault injection")."""
    def s(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f} s"

    faults = "; ".join(f"{f.target}, {f.how}" for f in run.faults) or "—"
    healthy = ", ".join(s(f.healthy_after_s) for f in run.faults) or "—"
    nxt = ", ".join(s(f.next_step_after_s) for f in run.faults) or "—"
    resumed = ", ".join(f"step {r}" for r in figures["learner_resumes"]) or "—"
    return (f"| {faults} | {run.target_steps} | {figures['dispatched']} ({figures['task_entries']} entries) | "
            f"{figures['trained_once']} | {figures['dropped']} | {figures['dead_lettered']} | "
            f"{figures['in_flight']} | {figures['lost']} | {figures['trained_twice']} | {resumed} | "
            f"{healthy} | {nxt} |")
