"""Validation during training for `searchr1 up` (`[launcher.validation]`, Search-R1's `trainer.test_freq` and
`trainer.val_before_train`): the learner's snapshots evaluated on a held-out set while it trains, against the
run's own retriever and reward service, and the curve recorded.

Two loops beside the supervisor's watch. Discovery looks at the learner's weights directory every
`poll_interval_s` and stages every due version at once: what rebuilds it — the newest full version at or
before it and the deltas after it (`v########/`, `d########/`, the learner's layout) — hard-linked into
`RUN_DIR/validation/v########/chain`, so the learner pruning its old versions loses nothing. Evaluation
takes the queue in order, one version at a time: `searchr1 weights export` of the staged chain into
`…/model` (a loadable folder: the version rebuilt and verified, the base model's tokenizer), then
`searchr1 eval` of it (greedy, `--out RUN_DIR/validation/v########`), each a subprocess whose output is
appended to RUN_DIR/logs/validation.log, with the rollout workers' environment (tokens, engine settings)
less their Redis URL; the chain and the folder are deleted after (the reports stay). Step 0
(`eval_before_train`) evaluates the base model itself. Each result goes to `RUN_DIR/validation.jsonl`
(one JSON object per validation: step, version, the greedy scores, failures, the fingerprint id, the
outcome), to the Prometheus gauges (`metrics.ValidationMetrics`), to TensorBoard and W&B when asked, and to
the console. When the learner ends, `finish` validates its last version (`eval_after_train`) and waits for
the queue within `drain_timeout_s`; the services stop after that. How a `searchr1 up` plan becomes a
`Validator` (its eval command, environment, base model, trackers) is `validation_setup.py`.

Departures from Search-R1: validation runs beside the training instead of pausing it (the learner never
waits for it), and in a process of its own (its own engine), so a validation that fails is recorded, not
fatal to the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from searchr1.launcher.metrics import SCORE_METRICS, ValidationMetrics
from searchr1.launcher.settings import ValidationSettings

VERSION_DIR = re.compile(r"^([vd])(\d{8,})$")
"""A published version's directory: `v` a full snapshot, `d` a delta against the version before."""
WEIGHTS_FILE = "model.safetensors"
DELTA_FILE = "model.delta"
"""What a complete full snapshot and a complete delta hold (the learner renames a finished one into place)."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
SKIP_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json", "snapshot.manifest.json")


def published(weights_dir: Path) -> dict[int, set[str]]:
    """Version → the forms it is on disk in (`v` full, `d` delta), complete ones only."""
    out: dict[int, set[str]] = {}
    if not weights_dir.is_dir():
        return out
    for p in weights_dir.iterdir():
        m = VERSION_DIR.match(p.name)
        if m and p.is_dir() and (p / (WEIGHTS_FILE if m.group(1) == "v" else DELTA_FILE)).is_file():
            out.setdefault(int(m.group(2)), set()).add(m.group(1))
    return out


def published_versions(weights_dir: Path) -> list[int]:
    """Every version published, full or as a delta."""
    return sorted(published(weights_dir))


def stage_chain(weights_dir: Path, version: int, out: Path) -> Path:
    """Hard-link into `out` what `version` is rebuilt from: the newest full version at or before it, and every
    delta after that one up to it (just the full one when `version` is full). OSError when the chain on disk
    does not reach it."""
    forms = published(weights_dir)
    fulls = [v for v, f in forms.items() if v <= version and "v" in f]
    if not fulls:
        raise OSError(f"no full version at or before {version} in {weights_dir}")
    start = max(fulls)
    names = [f"v{start:08d}"] + [f"d{k:08d}" for k in range(start + 1, version + 1)]
    missing = [n for n in names if not (weights_dir / n).is_dir()]
    if missing:
        raise OSError(f"version {version} cannot be rebuilt: {', '.join(missing)} not in {weights_dir}")
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for name in names:
        (tmp / name).mkdir(parents=True)
        for f in (weights_dir / name).iterdir():
            if f.is_file():
                _link(f, tmp / name / f.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused: a copy
        shutil.copy2(src, dst)


def stage_model(base: Path, snapshot: Path | None, out: Path) -> Path:
    """A loadable model directory at `out`: the base model's files except its weights (tokenizer, chat
    template, config), with the snapshot's files (config, weights) over them; `snapshot` None stages the
    base model itself (its weights linked too)."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in base.iterdir():
        if not f.is_file() or f.name in SKIP_FILES:
            continue
        if f.suffix in WEIGHT_SUFFIXES:
            if snapshot is None:
                _link(f, tmp / f.name)
            continue
        shutil.copy2(f, tmp / f.name)
    if snapshot is not None:
        for f in snapshot.iterdir():
            if f.is_file() and f.name not in SKIP_FILES:
                (tmp / f.name).unlink(missing_ok=True)
                _link(f, tmp / f.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def record_of(step: int, doc: dict[str, Any], wall_s: float, outcome: str) -> dict[str, Any]:
    """The validation.jsonl record of one evaluation (eval.json's greedy summary)."""
    g = doc.get("summary", {}).get("greedy", {}).get("overall", {})
    failed = int(g.get("failed_searches") or 0) + int(g.get("failed_scores") or 0)
    fp = (doc.get("meta", {}).get("fingerprint") or {}).get("id")
    return {"step": step, "version": step, "time": time.time(), "outcome": outcome, "questions": g.get("questions"),
            **{k: g.get(k) for k in SCORE_METRICS}, "searches": g.get("searches"), "failed": failed,
            "failure_rate": g.get("failure_rate"), "fingerprint": fp, "wall_s": round(wall_s, 1)}


class Validator:
    """Runs the validations of one `searchr1 up` run (module docstring)."""

    def __init__(self, settings: ValidationSettings, *, run_dir: Path, weights_dir: Path, base_model: Path,
                 command: Callable[[Path, Path], list[str]], export_command: Callable[[Path, int, Path], list[str]],
                 env: dict[str, str], say: Callable[[str, str], None], metrics: ValidationMetrics | None = None,
                 trackers: list[Any] | None = None, metrics_host: str | None = None,
                 metrics_port: int | None = None) -> None:
        """`command(model_dir, out_dir)`: the eval argv; `export_command(chain_dir, version, model_dir)`:
        the argv that rebuilds a staged version into a model folder; `env`: what both processes add to the
        launcher's environment; `say(message, style)`: the console; `metrics` are served on
        `metrics_host:metrics_port` while the loop runs (None: not served)."""
        self.s = settings
        self.run_dir = run_dir
        self.weights_dir = weights_dir
        self.base = base_model
        self.command = command
        self.export_command = export_command
        self.env = env
        self.say = say
        self.metrics = metrics
        self.trackers = trackers or []
        self.root = run_dir / "validation"
        self.jsonl = run_dir / "validation.jsonl"
        self.queue: deque[tuple[int, Path]] = deque()
        self.seen = 0 if not settings.eval_before_train else -1
        self.done: set[int] = set()
        self.busy = False
        self.finishing = False
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task | None = None
        self.metrics_host = metrics_host
        self.metrics_port = metrics_port
        self._server: Any = None
        self._discovering = threading.Lock()

    # ------------------------------------------------------------------ discovery
    def due(self, version: int) -> bool:
        every = self.s.eval_every
        return every > 0 and version > 0 and version % every == 0

    def discover(self, final: bool = False) -> None:
        """Stage and queue every new due version (and, with `final`, the newest if it is not validated).
        Blocking file work, called from a thread; one discovery at a time."""
        with self._discovering:
            if self.seen < 0:  # eval_before_train: the initial policy, as step 0
                self.seen = 0
                self.queue.append((0, stage_model(self.base, None, self.root / "v00000000" / "model")))
            versions = published_versions(self.weights_dir)
            fresh = [v for v in versions if v > self.seen]
            for v in fresh:
                if self.due(v):
                    self._enqueue(v)
            if final and versions and self.s.eval_every > 0 and self.s.eval_after_train:
                last = versions[-1]
                if last not in self.done and all(v != last for v, _ in self.queue):
                    self._enqueue(last)
            if fresh:
                self.seen = fresh[-1]

    def _enqueue(self, v: int) -> None:
        try:
            chain = stage_chain(self.weights_dir, v, self.root / f"v{v:08d}" / "chain")
        except OSError as exc:  # pruned between listing and linking: nothing to validate
            self.say(f"validation: version {v} is gone before it could be staged ({exc})", "yellow")
            return
        self.queue.append((v, chain))

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        """Serve the gauges, and start the loop (`run`) as a task of the running event loop."""
        if self.metrics is not None and self.metrics_port is not None:
            from searchr1.core.metrics import start_metrics_server

            self._server = start_metrics_server(self.metrics.registry, self.metrics_host or "127.0.0.1",
                                                self.metrics_port)
        self._task = asyncio.create_task(self.run(), name="validation")

    async def run(self) -> None:
        """Evaluate the queue in order, until `finish` (after the evaluation in progress), while discovery
        stages new versions beside it."""
        discovery = asyncio.create_task(self._discover_loop(), name="validation-discovery")
        try:
            while not self.finishing:
                if self.queue:
                    await self._next()
                else:
                    await asyncio.sleep(min(self.s.poll_interval_s, 0.5))
        finally:
            discovery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await discovery

    async def _discover_loop(self) -> None:
        while True:
            await asyncio.to_thread(self.discover)
            await asyncio.sleep(self.s.poll_interval_s)

    async def finish(self) -> None:
        """The learner ended: let the evaluation in progress end, validate the last version if it is due
        (`eval_after_train`), then empty the queue within `drain_timeout_s` (what is left is said, not run)."""
        deadline = time.monotonic() + self.s.drain_timeout_s
        self.finishing = True
        if self.busy:
            self.say("training ended; finishing the validation in progress …", "bold")
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), max(0.0, deadline - time.monotonic()))
        await asyncio.to_thread(self.discover, True)
        if self.queue:
            self.say(f"training ended; validating {len(self.queue)} more version(s) …", "bold")
        while self.queue and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self._next(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        if self.queue:
            self.say(f"validation: {len(self.queue)} version(s) not validated within drain_timeout_s "
                     f"({', '.join(str(v) for v, _ in self.queue)})", "yellow")

    async def finish_unless(self, stopped: Callable[[], bool], poll_s: float) -> None:
        """`finish`, cut short (its evaluation stopped) as soon as `stopped()` (a signal to the launcher)."""
        task = asyncio.create_task(self.finish())
        while not task.done():
            if stopped():
                task.cancel()
                break
            await asyncio.wait({task}, timeout=poll_s)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _next(self) -> None:
        step, staged = self.queue.popleft()
        self.busy = True
        try:
            await self._evaluate(step, staged)
        finally:
            self.busy = False
            self.done.add(step)

    async def _subprocess(self, argv: list[str], what: str, timeout_s: float) -> int:
        """Run `argv` with its output appended to RUN_DIR/logs/validation.log; its exit code (-1: stopped
        after `timeout_s`)."""
        log = self.run_dir / "logs" / "validation.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as f:
            f.write(f"\n==> {what}: {' '.join(argv)}\n".encode())
            f.flush()
            self._proc = await asyncio.create_subprocess_exec(
                *argv, stdout=f, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, **self.env}, start_new_session=True)
            try:
                return await asyncio.wait_for(self._proc.wait(), max(timeout_s, 1.0))
            except TimeoutError:
                await self._kill()
                return -1
            except asyncio.CancelledError:
                await self._kill()
                raise
            finally:
                self._proc = None

    async def _evaluate(self, step: int, staged: Path) -> None:
        """Step 0: the staged base model; a version: its staged chain rebuilt into a model folder first."""
        out = staged.parent
        model = out / "model"
        log = self.run_dir / "logs" / "validation.log"
        self.say(f"validating step {step} …", "")
        t0 = time.monotonic()
        try:
            rc = 0
            if step > 0:
                rc = await self._subprocess(self.export_command(staged, step, model), f"step {step}: rebuild",
                                            self.s.timeout_s)
            if rc == 0:
                rc = await self._subprocess(self.command(model, out), f"step {step}: evaluate",
                                            self.s.timeout_s - (time.monotonic() - t0))
        finally:  # the reports stay; the staged weights go
            await asyncio.to_thread(shutil.rmtree, model, True)
            if staged != model:
                await asyncio.to_thread(shutil.rmtree, staged, True)
        wall = time.monotonic() - t0
        doc = None
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((out / "eval.json").read_text(encoding="utf-8"))
        # exit 1 with eval.json: the evaluation ran but its failures passed eval.max_failure_rate
        outcome = "ok" if rc == 0 else "failures" if doc is not None and rc == 1 else "failed"
        record = record_of(step, doc or {}, wall, outcome) if doc is not None else {
            "step": step, "version": step, "time": time.time(), "outcome": outcome, "exit_code": rc,
            "wall_s": round(wall, 1)}
        await asyncio.to_thread(self._record, record)
        if doc is None:
            self.say(f"validation of step {step} failed (exit {rc}; see {log})", "bold red")
            return
        failed = f", {record['failed']} failed" if record["failed"] else ""
        self.say(f"validation, step {step}: Search-R1 EM {_f(record['searchr1_em'])}, EM {_f(record['em'])}, "
                 f"cover EM {_f(record['cover_em'])}, F1 {_f(record['f1'])} on {record['questions']} questions"
                 f"{failed} ({wall:.0f} s)", "bold green" if outcome == "ok" else "bold yellow")

    def _record(self, record: dict[str, Any]) -> None:
        """Append to validation.jsonl, set the gauges, hand the scores to the trackers (blocking)."""
        with self.jsonl.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        scores = {k: record[k] for k in SCORE_METRICS if isinstance(record.get(k), int | float)}
        if self.metrics is not None:
            self.metrics.runs.labels("ok" if record["outcome"] == "ok" else "failed").inc()
            self.metrics.seconds.set(record["wall_s"])
            if scores:
                self.metrics.step.set(record["step"])
                self.metrics.failed.set(record.get("failed") or 0)
                for k, v in scores.items():
                    self.metrics.score.labels(k).set(v)
        if scores:
            for tracker in self.trackers:
                tracker.log({f"validation/{k}": v for k, v in scores.items()}, step=record["step"])

    async def _kill(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def stop(self) -> None:
        """Cancel the loop (an evaluation in progress is stopped with its process group) and close the
        trackers."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._kill()
        self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for tracker in self.trackers:
            with contextlib.suppress(Exception):
                tracker.close()
        self.trackers = []


def _f(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, int | float) else "–"
