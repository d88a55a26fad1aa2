"""Process plumbing for the supervisor: shell-style exit codes, the kernel's parent-death signal, process
groups (every child runs in its own session, so a signal to the group reaches the child's own children —
vLLM's engine process, say), starting one process with its output piped to the log mux (`spawn`) and
the record of a started process (`Running`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from searchr1.core.commandline import EXIT_FAILED, EXIT_USAGE
from searchr1.core.redaction import redact_argv
from searchr1.launcher.logs import LogMux
from searchr1.launcher.specs import ProcessSpec

EXIT_REFUSED = EXIT_USAGE
"""A plan the launcher refuses before anything starts (a port in use, a missing index): a usage error."""


class Stop(Exception):
    """Raised inside the start/watch phases to end the run with `code` (then everything is stopped).
    `message` is said in red (bold if `code` ≠ 0) and the log tails of `tail_of` are shown."""

    def __init__(self, code: int, message: str | None = None, tail_of: tuple[str, ...] = ()) -> None:
        super().__init__(code)
        self.code = code
        self.message = message
        self.tail_of = tail_of


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: a negative returncode (-n, killed by signal n) becomes 128+n."""
    return 128 - returncode if returncode < 0 else returncode


def pdeathsig_preexec():
    """A preexec_fn asking the kernel to SIGTERM the child when the launcher dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def _set() -> None:
        prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died between fork and prctl
            os._exit(1)

    return _set


def child_preexec(die_with_launcher: bool, cores: tuple[int, ...]):
    """The preexec_fn of a child: the parent-death signal (when `die_with_launcher`) and the CPU affinity
    `cores` (when given; inherited by the child's own children), or None when neither applies."""
    deathsig = pdeathsig_preexec() if die_with_launcher else None
    if not cores:
        return deathsig

    def _set() -> None:
        os.sched_setaffinity(0, cores)
        if deathsig is not None:
            deathsig()

    return _set


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a member we cannot signal still exists
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@dataclass
class Running:
    """A started process."""

    spec: ProcessSpec
    proc: asyncio.subprocess.Process
    started_at: float
    pumps: list[asyncio.Task] = field(default_factory=list)
    waiter: asyncio.Task | None = None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode


async def _wait_or_force(aw: Awaitable[object], deadline: float, force: asyncio.Event) -> bool:
    """Await `aw` until the deadline or a forced stop; True if it completed."""
    task = asyncio.ensure_future(aw)
    forced = asyncio.create_task(force.wait())
    try:
        done, _ = await asyncio.wait({task, forced}, timeout=max(0.0, deadline - time.monotonic()),
                                     return_when=asyncio.FIRST_COMPLETED)
        return task in done
    finally:
        forced.cancel()
        if not task.done():
            task.cancel()


async def terminate_group(run: Running, grace_s: float, force: asyncio.Event,
                          say: Callable[..., None]) -> None:
    """Stop a started process and its process group: SIGTERM to the process itself (not its children: a
    rollout worker stops its vLLM engine after its last call, so none fails under it), then SIGKILL to the
    group after `grace_s` (at once when `force` is set); the group's other members get SIGTERM once the
    leader is gone, and SIGKILL at the same deadline."""
    pgid = run.proc.pid
    name = run.spec.name
    deadline = time.monotonic() + grace_s
    if run.returncode is None:
        say(f"stopping {name} (SIGTERM)")
        with contextlib.suppress(ProcessLookupError):
            os.kill(run.proc.pid, signal.SIGTERM)
        # the leader's exit, not `proc.wait()`: that also waits for its output pipes, which a child holds
        if not await _wait_or_force(_exited(run), deadline, force):
            say(f"{name} still running after {grace_s:.0f}s: SIGKILL", "yellow")
            signal_group(pgid, signal.SIGKILL)
    # the leader is gone; its process group (children it started) must go too
    if group_alive(pgid):
        signal_group(pgid, signal.SIGTERM)
        while group_alive(pgid) and time.monotonic() < deadline and not force.is_set():
            await asyncio.sleep(0.05)
        if group_alive(pgid):
            signal_group(pgid, signal.SIGKILL)
    await run.proc.wait()


async def _exited(run: Running) -> None:
    while run.returncode is None:
        await asyncio.sleep(0.05)


def write_process_table(path: Path, running: dict[str, Running], restarts: dict[str, int]) -> None:
    """RUN_DIR/processes.json: name → pid and argv (secrets hidden) of every started process (for
    operators/tests)."""
    table = {name: {"pid": r.proc.pid, "argv": redact_argv(r.spec.argv), "restarts": restarts.get(name, 0)}
             for name, r in running.items()}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=2))
    tmp.replace(path)


async def _wait_then(proc: asyncio.subprocess.Process, on_exit: Callable[[], None]) -> None:
    await proc.wait()
    on_exit()


async def spawn(spec: ProcessSpec, mux: LogMux, *, die_with_launcher: bool,
                on_exit: Callable[[], None] = lambda: None) -> Running:
    """Start `spec`'s process in its own session (with the parent-death signal when `die_with_launcher`),
    its log opened with a header line, its directories made, its `stdin` bytes written and closed, and
    both output pipes pumped into `mux`; `on_exit` is called when it exits (its `waiter` task). Raises
    `Stop` when it cannot be started."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
    log = mux.open(spec.name)
    with contextlib.suppress(OSError):  # a full disk: the header is lost, the process still starts
        log.write(f"--- searchr1 up: {spec.name} starting at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                  f"{shlex.join(spec.argv)} ---\n".encode())
        log.flush()
    for directory in spec.make_dirs:
        directory.mkdir(parents=True, exist_ok=True)
    try:
        stdin = asyncio.subprocess.DEVNULL if spec.stdin is None else asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(
            *spec.argv, stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
            start_new_session=True, preexec_fn=child_preexec(die_with_launcher, spec.cores))
    except (OSError, subprocess.SubprocessError) as exc:  # the latter: its preexec_fn failed (affinity)
        raise Stop(EXIT_FAILED, f"cannot start {spec.name}: {exc}") from exc
    if proc.stdin is not None and spec.stdin is not None:  # a secret config (Redis's password), not argv
        proc.stdin.write(spec.stdin)
        proc.stdin.close()
    assert proc.stdout is not None and proc.stderr is not None
    return Running(spec, proc, time.monotonic(),
                   pumps=[asyncio.create_task(mux.pump(spec.name, proc.stdout)),
                          asyncio.create_task(mux.pump(spec.name, proc.stderr))],
                   waiter=asyncio.create_task(_wait_then(proc, on_exit)))
