"""One variant of the system benchmark (`benchmarks/system.py`): a real `searchr1 up` of a config derived
from a base run config (configs/tiny-cpu.toml by default), watched from outside (the learner's JSONL step
log, every process's `/metrics`, the load average), then `searchr1 eval` of the final snapshot on the
held-out questions.

Nothing here is timed by hand: the stage seconds are the services' own stage clocks
(`searchr1_rollout_stage_seconds_total`, `searchr1_learner_stage_seconds_total`, and the learner's per-step
`stage_seconds` in its JSONL); the rollout side's counters (tokens, turns, searches, search latency,
reloads) are scraped beside them, so a run's record holds what the pipeline simulator
(`searchr1 plan check`) needs. With `search_latency_ms` the worker reaches the retriever through a
loopback proxy that delays each direction by half of it (`tests/faults/chaos_proxy.py`): slower searches.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families
from system_variants import Variant

ROOT = Path(__file__).resolve().parents[1]
BASE_CONFIG = ROOT / "configs" / "tiny-cpu.toml"
WARMSTART = ROOT / "assets" / "tiny-world" / "warmstart"
COUNTERS = ("searchr1_rollout_search_latency_seconds_sum", "searchr1_rollout_search_latency_seconds_count",
            "searchr1_rollout_searches_sum", "searchr1_rollout_turns_sum", "searchr1_rollout_turns_count",
            "searchr1_rollout_weight_reload_seconds_sum", "searchr1_rollout_weight_reload_seconds_count",
            "searchr1_rollout_env_tokens_total", "searchr1_rollout_groups_total",
            "searchr1_rollout_group_seconds_sum", "searchr1_learner_groups_dropped_total")
"""Counters scraped beside the stage clocks (the simulator's inputs; the learner's drops summed over
their reasons)."""


@dataclass(frozen=True)
class Workload:
    """What every variant of one invocation runs: the base config, its warm start, extra overrides."""

    config: Path = BASE_CONFIG
    warmstart: Path = WARMSTART
    overrides: dict[str, Any] = field(default_factory=dict)
    """`--set KEY=VALUE` overrides, for every variant."""
    search_latency_ms: float = 0.0
    """Added to every retriever call (a delaying proxy in front of the retriever's gRPC port)."""


@dataclass
class Scrape:
    t: float
    stages: dict[str, dict[str, float]]
    """Process (`learner`, `rollout-0`, …) → stage → seconds."""
    generated_tokens: float = 0.0
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    """Process → `COUNTERS` name → value (absent in records taken before they were scraped)."""


@dataclass
class RunRecord:
    variant: Variant
    run_dir: Path
    rc: int
    t_start: float
    t_up: float | None
    """When the learner answered on /metrics and a first worker had logged `ready` (engine up, weights
    loaded): from here the run can make progress; the start of every figure's window."""
    steps: list[dict[str, Any]]
    scrapes: list[Scrape]
    load: list[tuple[float, float]]
    eval: dict[str, Any] | None = None


def set_dotted(table: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for p in parents:
        table = table.setdefault(p, {})
    table[last] = value


def drop_dotted(table: dict[str, Any], key: str) -> None:
    *parents, last = key.split(".")
    for p in parents:
        table = table.get(p, {})
    table.pop(last, None)


def variant_config(variant: Variant, steps: int, world: Path, run_dir: Path, ports: tuple[int, int],
                   workload: Workload = Workload(), via: tuple[str, int] | None = None) -> dict:
    """The workload's base config with this variant's staleness, workers, placement, step count, world and
    ports; `via`: (the address the worker reaches the retriever at, the retriever's own gRPC port)."""
    cfg = tomllib.loads(workload.config.read_text())
    for key in variant.drop:
        drop_dotted(cfg, key)
    learner_port, rollout_port = ports
    warmstart = workload.warmstart
    values = {
        "launcher.run": f"bench-{variant.name}",
        "launcher.run_dir": str(run_dir),
        "launcher.retriever.index_dir": str(world / "index-bm25"),
        "launcher.retriever.corpus": str(world / "corpus.jsonl"),
        "launcher.rollout.workers": variant.workers,
        "launcher.rollout.metrics_port": rollout_port,
        "launcher.learner.metrics_port": learner_port,
        "launcher.demo.world_dir": str(world),
        "launcher.demo.warmstart_dir": str(warmstart),
        "launcher.demo.eval_data": str(world / "test.parquet"),
        "rollout.model": str(warmstart),
        "learner.model.path": str(warmstart),
        "learner.algorithm.max_staleness": variant.max_staleness,
        "learner.optim.total_steps": steps,
        "learner.dispatcher.dataset": str(world / "train.parquet"),
        "learner.weights.dir": str(run_dir / "weights"),
        "learner.checkpoint.dir": str(run_dir / "checkpoints"),
        **variant.overrides,
        **workload.overrides,
    }
    if via is not None:
        from searchr1.launcher.specs import DEFAULT_TEMPLATES

        values["launcher.retriever.grpc_port"] = via[1]
        values["launcher.templates.rollout"] = [via[0] if a == "{retriever_grpc}" else a
                                                for a in DEFAULT_TEMPLATES["rollout"]]
    for k, v in values.items():
        set_dotted(cfg, k, v)
    return cfg


def free_ports(n: int) -> int:
    """A base port with `n` consecutive free ports."""
    from searchr1.core.servers import free_port, port_is_free

    for _ in range(200):
        base = free_port()
        if base + n < 65535 and all(port_is_free("127.0.0.1", base + i) for i in range(n)):
            return base
    raise RuntimeError("no run of free ports")


def scrape(url: str) -> tuple[dict[str, float], float, dict[str, float]] | None:
    """(stage → seconds, generated tokens, `COUNTERS`) from one `/metrics`, or None when it does not
    answer."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:
            text = r.read().decode()
    except OSError:
        return None
    stages: dict[str, float] = {}
    counters: dict[str, float] = {}
    tokens = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_stage_seconds_total"):
                stages[s.labels["stage"]] = s.value
            elif s.name == "searchr1_rollout_tokens_generated_total":
                tokens = s.value
            elif s.name in COUNTERS:
                counters[s.name] = counters.get(s.name, 0.0) + s.value
    return stages, tokens, counters


def read_steps(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class SearchDelay:
    """A loopback proxy in front of the retriever's gRPC port delaying each direction by half of
    `latency_ms`, on its own event loop in a thread (`tests/faults/chaos_proxy.py`)."""

    def __init__(self, latency_ms: float) -> None:
        sys.path.insert(0, str(ROOT))
        from tests.faults.chaos_proxy import ChaosProxy, LinkShape

        self.target_port = free_ports(1)
        self.loop = asyncio.new_event_loop()
        self.proxy = ChaosProxy(("127.0.0.1", self.target_port), shape=LinkShape(latency_ms=latency_ms / 2))
        self.thread = threading.Thread(target=self.loop.run_forever, name="search-delay", daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(timeout=10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def run_variant(variant: Variant, steps: int, world: Path, out: Path, timeout_s: float,
                poll_s: float = 2.0, log=print, workload: Workload = Workload()) -> RunRecord:
    """Train one variant through `searchr1 up` and watch it; the run directory is `out/<name>`."""
    run_dir = out / variant.name
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists: remove it or give another --out")
    run_dir.mkdir(parents=True)
    learner_port = free_ports(1)
    rollout_port = free_ports(variant.workers)
    while learner_port in range(rollout_port, rollout_port + variant.workers):
        learner_port = free_ports(1)
    delay = SearchDelay(workload.search_latency_ms) if workload.search_latency_ms > 0 else None
    cfg_path = run_dir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(variant_config(
        variant, steps, world, run_dir, (learner_port, rollout_port), workload,
        (delay.address, delay.target_port) if delay else None),
        sort_keys=False))
    try:
        return _watch(variant, run_dir, cfg_path, (learner_port, rollout_port), timeout_s, poll_s, log)
    finally:
        if delay is not None:
            delay.close()


def _watch(variant: Variant, run_dir: Path, cfg_path: Path, ports: tuple[int, int], timeout_s: float,
           poll_s: float, log) -> RunRecord:
    learner_port, rollout_port = ports
    urls = {"learner": f"http://127.0.0.1:{learner_port}/metrics"}
    urls.update({f"rollout-{i}": f"http://127.0.0.1:{rollout_port + i}/metrics" for i in range(variant.workers)})
    jsonl = run_dir / "learner" / f"bench-{variant.name}.jsonl"
    cmd = [sys.executable, "-m", "searchr1.cli", "up", "--config", str(cfg_path), "--run-dir", str(run_dir)]
    log(f"  {variant.name}: {' '.join(cmd[1:])}")
    scrapes: list[Scrape] = []
    load: list[tuple[float, float]] = []
    t_up = None
    ready: set[str] = set()
    t_start = time.time()
    with (run_dir / "up.log").open("wb") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                time.sleep(poll_s)
                now = time.time()
                load.append((now, os.getloadavg()[0]))
                if now - t_start > timeout_s:
                    log(f"  {variant.name}: over {timeout_s:.0f} s, stopping it")
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=120)
                    break
                for i in range(variant.workers):
                    worker_log = run_dir / "logs" / f"rollout-{i}.log"
                    if f"rollout-{i}" not in ready and worker_log.is_file() and b" ready: run=" in worker_log.read_bytes():
                        ready.add(f"rollout-{i}")
                got = {name: scrape(url) for name, url in urls.items()}
                if got["learner"] is None or not ready:
                    continue
                t_up = t_up or now
                if all(v is not None for v in got.values()):
                    scrapes.append(Scrape(now, {k: v[0] for k, v in got.items()},
                                          sum(v[1] for k, v in got.items() if k != "learner"),
                                          {k: v[2] for k, v in got.items()}))
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=120)
            raise
    rc = proc.returncode
    steps_log = read_steps(jsonl)
    log(f"  {variant.name}: exit code {rc}, {len(steps_log)} steps, {time.time() - t_start:.0f} s")
    return RunRecord(variant, run_dir, rc, t_start, t_up, steps_log, scrapes, load)


def evaluate(record: RunRecord, samples: int, limit: int | None, log=print) -> dict[str, Any] | None:
    """`searchr1 eval` (with its retriever and reward) of the run's last snapshot; the summary of eval.json."""
    from rich.console import Console

    from searchr1.core.settings import load_settings
    from searchr1.launcher.demo import assemble_model, latest_snapshot
    from searchr1.launcher.planner import build_plan
    from searchr1.launcher.settings import LauncherSettings
    from searchr1.launcher.specs import eval_plan
    from searchr1.launcher.supervisor import Supervisor

    snap = latest_snapshot(record.run_dir / "weights")
    if snap is None:
        log(f"  {record.variant.name}: no snapshot to evaluate")
        return None
    cfg = record.run_dir / "config.yaml"
    settings = load_settings(LauncherSettings, cfg)
    model = assemble_model(Path(settings.demo.warmstart_dir), snap, record.run_dir / "final-model")
    out = record.run_dir / "eval"
    args = ["--model", str(model), "--data", str(settings.demo.eval_data), "--out", str(out),
            "--samples", str(samples)]
    if limit:
        args += ["--limit", str(limit)]
    plan = eval_plan(build_plan(settings, cfg, record.run_dir / "eval-run"), args, settings.templates)
    console = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - the supervisor's screen is not wanted here
    sup = Supervisor(plan, settings, console=console, verbose=False, title="eval")
    t0 = time.time()
    rc = asyncio.run(sup.run())
    if rc != 0 or not (out / "eval.json").is_file():
        log(f"  {record.variant.name}: eval failed (exit code {rc}; logs in {plan.log_dir})")
        return None
    summary = json.loads((out / "eval.json").read_text())["summary"]
    log(f"  {record.variant.name}: eval of {snap.name} in {time.time() - t0:.0f} s")
    return {"snapshot": snap.name, **summary}


def record_to_json(rec: RunRecord) -> dict[str, Any]:
    """Everything a report needs, to re-render it later (`system.py --from DIR`)."""
    v = rec.variant
    return {"variant": {"name": v.name, "label": v.label, "max_staleness": v.max_staleness, "workers": v.workers,
                        "overrides": v.overrides, "drop": list(v.drop)},
            "run_dir": str(rec.run_dir), "rc": rec.rc, "t_start": rec.t_start, "t_up": rec.t_up,
            "steps": rec.steps, "load": rec.load, "eval": rec.eval,
            "scrapes": [{"t": s.t, "stages": s.stages, "generated_tokens": s.generated_tokens, "counters": s.counters}
                        for s in rec.scrapes]}


def record_from_json(d: dict[str, Any]) -> RunRecord:
    v = dict(d["variant"])
    v["drop"] = tuple(v.get("drop", ()))
    return RunRecord(Variant(**v), Path(d["run_dir"]), d["rc"], d["t_start"], d["t_up"], d["steps"],
                     [Scrape(**s) for s in d["scrapes"]], [tuple(x) for x in d["load"]], d["eval"])
