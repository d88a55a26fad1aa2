"""Process checks shared by the tests that start real processes (the launcher's, the fault suite's)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
