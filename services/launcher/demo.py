"""`searchr1 demo`: the tiny world end to end, through the real services, on a few CPU cores.

Stages (each a subprocess or a supervised launch, so a failure names the step and its log):

1. world      `searchr1 world build --seed S --out WORLD`            (skipped when WORLD/manifest.json exists)
2. warm start `searchr1 world warmstart --world WORLD --out WARM`   (skipped when WARM has weights)
3. eval       retriever + reward + `searchr1 eval --model WARM`     → RUN/eval-before/
4. train      `searchr1 up` (Redis, retriever, reward, rollout workers, GRPO learner)
5. eval       the last published snapshot (with WARM's tokenizer)   → RUN/eval-after/
6. report     RUN/report.md, report.png, report.json + a one-screen summary

The console names each stage as `[n/6] stage` and, during stages 3-5, shows the supervisor's quiet view
(warnings, errors, a progress bar with ETA, the status line); every process's full output is in
RUN/logs/<name>.log, and `verbose` streams it all to the console as well.

Imports only `searchr1.core` and this package; the services run as subprocesses.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from searchr1.launcher.logs import ConsoleFilter, console_text
from searchr1.launcher.planner import build_plan
from searchr1.launcher.processes import EXIT_FAILED, EXIT_REFUSED
from searchr1.launcher.report import write_report
from searchr1.launcher.settings import LauncherSettings
from searchr1.launcher.specs import LaunchPlan, eval_plan, total_steps
from searchr1.launcher.status import StatusCollector
from searchr1.launcher.supervisor import Supervisor
from searchr1.weightsync import materialize

STAGES = ("world", "warm start", "eval-before", "train", "eval-after", "report")


class DemoError(RuntimeError):
    """The demo cannot go on: the message names the stage (or the run directory) on one line."""

    def __init__(self, message: str, *, code: int = EXIT_FAILED, tail: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        """The command's exit code: 1 for a stage that failed, 2 for a run directory it refuses."""
        self.tail = tail
        """The failed stage's last log lines (shown above the error line)."""


@dataclass(frozen=True)
class DemoPaths:
    world: Path
    warmstart: Path
    eval_data: Path
    run_dir: Path
    weights: Path
    steps_log: Path


def resolve_paths(settings: LauncherSettings, config: Path, run_dir: Path | None) -> DemoPaths:
    """Where everything lives; the learner's snapshots go to RUN_DIR/weights (the launcher sets it)."""
    d = settings.demo
    run = Path(run_dir if run_dir is not None else settings.run_dir).resolve()
    weights = Path(d.weights_dir) if d.weights_dir else run / "weights"
    jsonl = settings.learner.metrics_jsonl.format(run=settings.run, run_dir=str(run))
    return DemoPaths(world=Path(d.world_dir).resolve(), warmstart=Path(d.warmstart_dir).resolve(),
                     eval_data=Path(d.eval_data).resolve(), run_dir=run, weights=Path(weights).resolve(),
                     steps_log=Path(jsonl).resolve())


def has_weights(model_dir: Path) -> bool:
    return (model_dir / "config.json").is_file() and any(model_dir.glob("*.safetensors"))


def latest_snapshot(weights_dir: Path) -> Path | None:
    """The highest-version `v########` snapshot directory with weights, if any; when the newest version
    was published as a delta, its full snapshot is first rebuilt from the chain (`materialize`)."""
    if weights_dir.is_dir():
        materialize(weights_dir)
    snaps = sorted(p for p in weights_dir.glob("v*") if p.is_dir() and p.name[1:].isdigit() and has_weights(p))
    return snaps[-1] if snaps else None


def assemble_model(warmstart: Path, snapshot: Path, out: Path) -> Path:
    """A loadable model dir: the warm start's files (tokenizer, chat template) with the snapshot's config
    and weights over them (snapshots carry weights only)."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(warmstart, out)
    for f in out.glob("*.safetensors"):
        f.unlink()
    for f in snapshot.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)
    return out


class Demo:
    """Runs the stages; `console` shows each stage and what needs attention (everything when `verbose`)."""

    def __init__(self, settings: LauncherSettings, config: Path, paths: DemoPaths, console: Console,
                 base_command: list[str], verbose: bool = False) -> None:
        self.s = settings
        self.config = config
        self.paths = paths
        self.console = console
        self.base = base_command
        self.verbose = verbose
        self.timings: dict[str, float] = {}

    def _say(self, stage: str, message: str) -> None:
        n = STAGES.index(stage) + 1
        self.console.print(f"[bold cyan]demo [{n}/{len(STAGES)}] {stage}[/]: {message}", soft_wrap=True)

    def _title(self, stage: str) -> str:
        return f"[{STAGES.index(stage) + 1}/{len(STAGES)}] {stage}"

    def _run(self, stage: str, name: str, args: list[str]) -> None:
        log = self.paths.run_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self._say(stage, f"searchr1 {' '.join(args)}  (log: {log})")
        keep = ConsoleFilter()
        with log.open("ab") as f, subprocess.Popen([*self.base, *args], stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT) as proc:
            assert proc.stdout is not None
            for raw in proc.stdout:  # the file gets every line, the console what matters (all if verbose)
                f.write(raw)
                text = console_text(raw.rstrip(b"\n"))
                if text and (keep(text) or self.verbose):
                    self.console.print(f"{name} │ {text}", markup=False, highlight=False, soft_wrap=True)
        rc = proc.returncode
        if rc != 0:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise DemoError(f"{name} failed with exit code {rc} (last lines above; all of them in {log})",
                            tail=tuple(tail))

    def _timed(self, name: str, fn, *a: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*a)
        finally:
            self.timings[name] = time.monotonic() - t0

    def world(self) -> None:
        if (self.paths.world / "manifest.json").is_file():
            self._say("world", f"cached at {self.paths.world}")
            return
        self._run("world", "world-build", ["world", "build", "--seed", str(self.s.demo.seed), "--out", str(self.paths.world)])

    def warmstart(self) -> None:
        if has_weights(self.paths.warmstart):
            self._say("warm start", f"cached at {self.paths.warmstart}")
            return
        self._run("warm start", "warmstart", ["world", "warmstart", "--world", str(self.paths.world), "--out",
                                str(self.paths.warmstart), *self.s.demo.warmstart_args])

    async def _supervise(self, stage: str, plan: LaunchPlan, collector: StatusCollector | None = None) -> int:
        sup = Supervisor(plan, self.s, console=self.console, collector=collector, verbose=self.verbose,
                         title=self._title(stage),
                         total_steps=total_steps(self.config) if collector is not None else None)
        return await sup.run()

    def evaluate(self, name: str, model: Path) -> dict[str, Any]:
        out = self.paths.run_dir / name
        plan = build_plan(self.s, self.config, self.paths.run_dir)
        plan = eval_plan(plan, ["--model", str(model), "--data", str(self.paths.eval_data), "--out", str(out),
                                *self.s.demo.eval_args], self.s.templates)
        plan.specs[-1].name = name
        self._say(name, f"evaluating {model}")
        rc = asyncio.run(self._supervise(name, plan))
        if rc != 0:
            raise DemoError(f"{name} failed with exit code {rc} (logs in {plan.log_dir})")
        return json.loads((out / "eval.json").read_text())

    def train(self) -> None:
        plan = build_plan(self.s, self.config, self.paths.run_dir)
        collector = StatusCollector(
            redis_url=plan.redis_url, run=plan.run, metrics_jsonl=plan.metrics_jsonl,
            learner_metrics_url=plan.learner_metrics_url, jsonl_keys=self.s.status.jsonl_keys,
            prometheus_names=self.s.status.prometheus_names)
        self._say("train", "searchr1 up (GRPO through the real services)")
        rc = asyncio.run(self._supervise("train", plan, collector))
        if rc != 0:
            raise DemoError(f"training (searchr1 up) ended with exit code {rc} (logs in {plan.log_dir})")

    def run(self) -> tuple[Path, list[str]]:
        p = self.paths
        if p.steps_log.exists() or latest_snapshot(p.weights) is not None:
            raise DemoError(f"run directory {p.run_dir} (or weights dir {p.weights}) already holds a run: "
                            f"choose another --run-dir or remove it", code=EXIT_REFUSED)
        self._timed("world", self.world)
        self._timed("warmstart", self.warmstart)
        before = self._timed("eval-before", self.evaluate, "eval-before", p.warmstart)
        self._timed("train", self.train)
        snap = latest_snapshot(p.weights)
        if snap is None:
            raise DemoError(f"training published no snapshot in {p.weights}")
        final = assemble_model(p.warmstart, snap, p.run_dir / "final-model")
        after = self._timed("eval-after", self.evaluate, "eval-after", final)
        meta = {"config": str(self.config), "world": str(p.world), "warm start": str(p.warmstart),
                "final snapshot": snap.name, "stage seconds": {k: round(v, 1) for k, v in self.timings.items()}}
        self._say("report", f"writing {p.run_dir / 'report.md'}")
        return write_report(p.run_dir, p.steps_log, before, after, meta)
