"""Process plumbing for the supervisor: shell-style exit codes, the kernel's parent-death signal, process
groups (every child runs in its own session, so a signal to the group reaches the child's own children —
vLLM's engine process, say) and the record of a started process (`Running`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field

from searchr1.launcher.specs import ProcessSpec


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
