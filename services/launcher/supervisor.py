"""The supervisor: runs a `LaunchPlan`'s processes, in order, gated on health; watches them; stops them all.

One loop, top to bottom: refuse (the plan's problems) → start stage by stage (spawn, then gate every
process of the stage on its health checks, or for a one-shot process wait for exit 0) → watch (status
line; wait for a signal, the main process's exit, or an unexpected death) → stop everything in reverse
stage order (SIGTERM to each process, wait `grace_period_s`, then SIGKILL to its process group).

Restarts (`restarts.py`, `[launcher.restart]`): a process whose spec has a restart rule, that has passed
its health checks once and that exits non-zero or dies of a signal is restarted in place — what is left of
its process group killed, the back-off waited, the same command started again (same ports, same
directories, its log appended to, the same `stdin`), and gated on its health checks again — while
everything else keeps running. The launcher says `restarting X (exit …, attempt n, backoff s)`, appends one JSON line per restart to
`RUN_DIR/restarts.jsonl` (name, exit code, attempt, back-off, when it died and when it was healthy again,
null if it died again first) and keeps a per-process count in `RUN_DIR/processes.json` and the status
line. A process that dies before it was ever healthy (a configuration error, not a crash to ride out),
a restarted process that does not become healthy within its health timeout, or more than `max_restarts`
deaths within `window_s` still end the run, and so does any process exiting with status 2, a usage or
configuration error (the learner's dataset row the wire refuses, a Redis too small for the settings): a
restart would meet it again, so the run stops with that process's log tail. The main process exiting 0
ends the run as before.

The launcher's own tasks are watched too: the pumps that copy each process's output to its log (a log
write that fails — a full disk — drops those lines and says so, and the pump keeps draining the pipe, so
a process never blocks on a full pipe), the waiters on each process and the restarts; one that dies ends
the run with its cause instead of leaving a process unwatched.

Validation (`validation.py`): once everything is up the validator evaluates snapshots beside the training;
when the learner exits 0 it finishes (`Validator.finish`) before the services it needs are stopped.

Exit codes: the main process's (the learner's; `128+n` if it died of signal n) when it ends the run;
`128+n` on SIGINT/SIGTERM (130/143); 1 when any other process dies without a restart left, fails its
gate or times out; 2 when the plan is refused before anything starts, or a process exits 2.

Every child runs in its own session/process group (`start_new_session=True`), so a terminal's Ctrl-C
reaches only the launcher, which then stops the children in order; a child's own children (vLLM's engine)
are left to it, then get SIGTERM once it is gone and SIGKILL after the grace period. On Linux each child also gets PR_SET_PDEATHSIG=SIGTERM: even a
launcher killed with SIGKILL leaves no child running. A spec's `stdin` bytes are written to it and closed.

The console (`LogMux`, `LiveView`): each process's whole output goes to `RUN_DIR/logs/<name>.log`; the
console gets the launcher's own messages, the lines that matter (this system's warnings, errors,
tracebacks) — every line with `verbose` — and at the bottom the stage, a progress bar and the status line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import signal
import time
from itertools import groupby

from rich.console import Console

from searchr1.core.commandline import EXIT_USAGE
from searchr1.core.run_connection import write_connection
from searchr1.core.servers import add_signal_handlers, remove_signal_handlers
from searchr1.launcher.health import check_all
from searchr1.launcher.logs import LogMux
from searchr1.launcher.processes import (
    EXIT_FAILED,
    EXIT_REFUSED,
    Running,
    Stop,
    exit_code_of,
    group_alive,
    signal_group,
    spawn,
    terminate_group,
    write_process_table,
)
from searchr1.launcher.restarts import RestartRule
from searchr1.launcher.settings import LauncherSettings
from searchr1.launcher.specs import LaunchPlan, ProcessSpec
from searchr1.launcher.status import StatusCollector
from searchr1.launcher.ticker import StatusTicker
from searchr1.launcher.validation import Validator
from searchr1.launcher.view import LiveView, PlainCadence

POLL_S = 0.2


class Supervisor:
    """Runs one `LaunchPlan` (see module docstring)."""

    def __init__(self, plan: LaunchPlan, settings: LauncherSettings, *, console: Console,
                 collector: StatusCollector | None = None, verbose: bool = False, title: str = "searchr1 up",
                 total_steps: int | None = None, validator: Validator | None = None) -> None:
        """`settings` gives the grace period, log tails, parent-death signal and status cadence;
        `collector` (None: no status line) the figures; `total_steps` the progress bar's total;
        `validator` (None: no validation) evaluates snapshots beside the training once everything is up."""
        self.plan = plan
        self.console = console
        self.s = settings
        self.collector = collector
        self.validator = validator
        self.verbose = verbose
        self.mux = LogMux(console, plan.log_dir, [s.name for s in plan.specs], verbose=verbose)
        self.view = LiveView(console, title, total_steps)
        self.running: dict[str, Running] = {}
        self._wake = asyncio.Event()
        self._force = asyncio.Event()
        self._signal: int | None = None
        status = settings.status
        cadence = PlainCadence(status.plain_interval_s, status.plain_every_percent, total_steps)
        self.ticker = None if collector is None else StatusTicker(
            collector, self.view, self.mux, cadence, status.refresh_s,
            lambda: f" · restarts {sum(self.restarts.values())}" if self.restarts else "")
        self.rules: dict[str, RestartRule] = {}
        """Restart history of every process that has a restart rule (created at its first death)."""
        self._restarting: dict[str, asyncio.Task] = {}
        self._fatal: Stop | None = None  # raised by the watch loop: a restart that could not be made
        self._was_healthy: set[str] = set()  # processes that passed their gates once: restartable

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts so far, per process that was restarted."""
        return {name: rule.total for name, rule in self.rules.items() if rule.total}

    # ---------------------------------------------------------------- the loop
    async def run(self) -> int:
        """Run the plan to its end; returns the launcher's exit code."""
        problems = list(self.plan.problems)
        for gate in self.plan.preflight_gates:
            ok, detail = await gate.check()
            if not ok:
                problems.append(f"{gate.description} failed: {detail}")
        if problems:
            for problem in problems:
                self.mux.say(f"refusing to start: {problem}", "bold red")
            return EXIT_REFUSED
        self.plan.run_dir.mkdir(parents=True, exist_ok=True)
        self.plan.log_dir.mkdir(parents=True, exist_ok=True)
        if self.plan.connection is not None:  # before anything starts: ops commands find the run by it
            write_connection(self.plan.run_dir, self.plan.connection)
        add_signal_handlers(self._on_signal)
        code = EXIT_FAILED
        if not self.verbose:
            self.mux.say(f"logs in {self.plan.log_dir} (--verbose streams them here)")
        self.view.start()
        try:
            try:
                await self._start_all()
                code = await self._watch()
            except Stop as stop:
                code = stop.code
                if stop.message:
                    self.mux.say(stop.message, "bold" if code == 0 else "bold red")
                for name in stop.tail_of:
                    await self._drain(name)
                    self.mux.say_tail(name, self.s.log_tail_lines)
        finally:  # whatever happened above (even a bug or a cancellation), nothing is left running
            if self.validator is not None:
                await self.validator.stop()
            if self.ticker is not None:
                await self.ticker.stop()
            self.view.phase("stopping")
            await asyncio.shield(self._stop_all())
            remove_signal_handlers()
            if self.collector is not None:
                await self.collector.close()
            self.mux.close_all()
            self.view.stop()
        if self.restarts:
            self.mux.say("restarts: " + ", ".join(f"{n} {k}" for n, k in self.restarts.items()), "bold")
        self.mux.say(f"exit code {code}", "bold" if code == 0 else "bold red")
        return code

    async def _start_all(self) -> None:
        for _stage, group in groupby(self.plan.specs, key=lambda s: s.stage):
            specs = list(group)
            for spec in specs:
                self._check_stop()
                await self._spawn(spec)
            names = ", ".join(s.name for s in specs)
            self.view.phase(f"running {names}" if all(s.oneshot for s in specs) else f"waiting for {names}")
            if all(s.oneshot for s in specs):
                await self._wait_oneshot(specs)
            else:
                await self._gate(specs)
        self.mux.say(f"all processes up; logs in {self.plan.log_dir}", "bold green")
        self.view.phase("running" if self.collector is None else "training")

    async def _watch(self) -> int:
        if self.collector is not None and self.ticker is not None:
            self.collector.scrape_learner = True
            self.ticker.start()
        if self.validator is not None:
            self.validator.start()
        while True:
            self._check_stop()
            try:
                self._check_exits(started=True)
            except Stop as stop:
                if stop.code == 0 and self.validator is not None:  # the learner is done: the last validations
                    self.view.phase("validating")
                    await self.validator.finish_unless(lambda: self._signal is not None, POLL_S)
                raise
            # polled, not only woken by a process's exit: asyncio's `wait()` returns once the process's pipes are
            # closed too, and a killed process's own children (vLLM's engine process) can hold them open
            await self._sleep_until_woken(POLL_S)

    # ---------------------------------------------------------------- start
    async def _spawn(self, spec: ProcessSpec) -> Running:
        self.mux.say(f"starting {spec.name}: {shlex.join(spec.argv)}" if self.verbose else f"starting {spec.name}")
        self.view.phase(f"starting {spec.name}")
        running = await spawn(spec, self.mux, die_with_launcher=self.s.die_with_launcher, on_exit=self._wake.set)
        self.running[spec.name] = running
        self._write_process_table()
        return running

    async def _wait_oneshot(self, specs: list[ProcessSpec]) -> None:
        deadline = time.monotonic() + max(s.health_timeout_s for s in specs)
        while True:
            self._check_stop()
            self._check_exits(started=False)
            if all(self.running[s.name].returncode == 0 for s in specs):
                for s in specs:
                    self.mux.say(f"{s.name} done in {time.monotonic() - self.running[s.name].started_at:.1f}s")
                return
            if time.monotonic() > deadline:
                late = tuple(s.name for s in specs if self.running[s.name].returncode is None)
                raise Stop(EXIT_FAILED, f"{', '.join(late)} did not finish within "
                                        f"{max(s.health_timeout_s for s in specs):.0f}s", tail_of=late)
            await self._sleep_until_woken(POLL_S)

    async def _gate(self, specs: list[ProcessSpec]) -> None:
        waiting = {s.name: s for s in specs}
        last: dict[str, str] = {}
        while waiting:
            self._check_stop()
            self._check_exits(started=False)
            for name, spec in list(waiting.items()):
                run = self.running[name]
                ok, detail = await check_all(spec.gates)
                self._check_stop()
                self._check_exits(started=False)
                last[name] = detail
                if ok:
                    del waiting[name]
                    self._was_healthy.add(name)
                    self.mux.say(f"{name} healthy after {time.monotonic() - run.started_at:.1f}s "
                                 f"({'; '.join(g.description for g in spec.gates) or 'no health check'})",
                                 "green")
                elif time.monotonic() - run.started_at > spec.health_timeout_s:
                    raise Stop(EXIT_FAILED, f"{name} did not become healthy within "
                                            f"{spec.health_timeout_s:.0f}s (last check: {last[name]})",
                               tail_of=(name,))
            if waiting:
                await self._sleep_until_woken(POLL_S)

    # ---------------------------------------------------------------- exits, signals
    def _check_stop(self) -> None:
        if self._signal is not None:
            raise Stop(128 + self._signal)
        if self._fatal is not None:
            raise self._fatal

    def _check_exits(self, started: bool) -> None:
        """Raise Stop for the first process that ended when it should not have (the main process ending
        ends the run with its code; a finished one-shot process is fine)."""
        for name, run in list(self.running.items()):
            for task in [*run.pumps, run.waiter]:
                if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    raise Stop(EXIT_FAILED, f"the launcher's watch of {name} died ({type(exc).__name__}: {exc}); "
                                            "stopping everything")
            rc = run.returncode
            if rc is None or name in self._restarting:
                continue
            if run.spec.oneshot and rc == 0:
                continue
            code = exit_code_of(rc)
            if code == EXIT_USAGE and not run.spec.oneshot:  # a usage or configuration error: never restarted
                raise Stop(EXIT_USAGE,
                           f"{name} exited with code {EXIT_USAGE}, a usage or configuration error (its log says "
                           "which): a restart would meet it again; stopping everything", tail_of=(name,))
            if name in self._was_healthy and code != 0 and run.spec.restart is not None:
                rule = self.rules.setdefault(name, RestartRule.from_settings(run.spec.restart))
                decision = rule.next_restart(time.monotonic())
                if decision is not None:
                    self._restarting[name] = asyncio.create_task(self._restart(run, code, *decision))
                    continue
                raise Stop(EXIT_FAILED if not run.spec.main else code,
                           f"{name} exited with code {code} after {rule.max_restarts} restart(s) within "
                           f"{rule.window_s:.0f}s; giving up and stopping everything", tail_of=(name,))
            if run.spec.main:
                raise Stop(code, f"{name} exited with code {code}; stopping everything",
                           tail_of=(name,) if code else ())
            if run.spec.oneshot:
                raise Stop(EXIT_FAILED, f"{name} failed with code {code}; stopping everything", tail_of=(name,))
            when = "" if started else " before becoming healthy"
            raise Stop(EXIT_FAILED, f"{name} exited unexpectedly with code {code}{when}; stopping everything",
                       tail_of=(name,))

    # ---------------------------------------------------------------- restarts
    async def _restart(self, old: Running, code: int, attempt: int, backoff: float) -> None:
        """Restart `old`'s process after `backoff` seconds and gate it again (see module docstring); a
        failure to start it or to get it healthy ends the run through `_fatal`."""
        spec = old.spec
        name = spec.name
        died_wall = time.time()
        self.mux.say(f"restarting {name} (exit {code}, attempt {attempt}, backoff {backoff:.1f}s)", "bold yellow")
        self._write_process_table()
        try:
            if group_alive(old.proc.pid):  # its own children (vLLM's engine process, say) go with it
                signal_group(old.proc.pid, signal.SIGKILL)
            if old.waiter is not None:
                await old.waiter
            await self._drain(name)
            self.mux.close(name)
            await asyncio.sleep(backoff)
            run = await self._spawn(spec)
            while True:
                if run.returncode is not None:  # died again: the watch loop decides on it, as on any death
                    self._record_restart({"name": name, "exit": code, "attempt": attempt,
                                          "backoff_s": round(backoff, 3), "died_at": died_wall, "healthy_at": None,
                                          "pid": run.proc.pid})
                    return
                ok, detail = await check_all(spec.gates)
                if ok:
                    break
                if time.monotonic() - run.started_at > spec.health_timeout_s:
                    raise Stop(EXIT_FAILED, f"{name} did not become healthy within {spec.health_timeout_s:.0f}s "
                                            f"after its restart (last check: {detail})", tail_of=(name,))
                await asyncio.sleep(POLL_S)
            healthy_wall = time.time()
            self.mux.say(f"{name} healthy again after {time.monotonic() - run.started_at:.1f}s "
                         f"(down {healthy_wall - died_wall:.1f}s in all)", "green")
            self._record_restart({"name": name, "exit": code, "attempt": attempt, "backoff_s": round(backoff, 3),
                                  "died_at": died_wall, "healthy_at": healthy_wall, "pid": run.proc.pid})
        except Stop as stop:
            self._fatal = stop
        except Exception as exc:  # noqa: BLE001 - a restart that failed any other way ends the run, named
            self._fatal = Stop(EXIT_FAILED, f"the restart of {name} failed: {type(exc).__name__}: {exc}; "
                                            "stopping everything", tail_of=(name,))
        finally:
            self._restarting.pop(name, None)
            self._wake.set()

    def _record_restart(self, record: dict) -> None:
        with (self.plan.run_dir / "restarts.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")

    async def _cancel_restarts(self) -> None:
        tasks = list(self._restarting.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _drain(self, name: str, timeout: float = 2.0) -> None:
        run = self.running.get(name)
        if run is None or not run.pumps:
            return
        _done, pending = await asyncio.wait(run.pumps, timeout=timeout)
        for task in pending:
            task.cancel()

    async def _sleep_until_woken(self, timeout: float | None) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()

    def _on_signal(self, sig: int) -> None:
        if self._signal is None:
            self._signal = int(sig)
            self.mux.say(f"{signal.Signals(sig).name}: stopping everything (again to kill at once)", "bold yellow")
        else:
            self._force.set()
            self.mux.say("second signal: killing everything now", "bold red")
        self._wake.set()

    # ---------------------------------------------------------------- stop
    async def _stop_all(self) -> None:
        await self._cancel_restarts()
        stages = [list(g) for _, g in groupby(self.plan.specs, key=lambda s: s.stage)]
        for specs in reversed(stages):
            runs = [self.running[s.name] for s in specs if s.name in self.running]
            if runs:
                await asyncio.gather(*(self._terminate(r) for r in runs))

    async def _terminate(self, run: Running) -> None:
        grace = 0.0 if self._force.is_set() else self.s.grace_period_s
        await terminate_group(run, grace, self._force, self.mux.say)
        if run.waiter is not None:
            await run.waiter
        await self._drain(run.spec.name)
        self.mux.close(run.spec.name)

    # ---------------------------------------------------------------- process table
    def _write_process_table(self) -> None:
        write_process_table(self.plan.run_dir / "processes.json", self.running, self.restarts)
