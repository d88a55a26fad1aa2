"""The durable record of what the dispatcher published: one task id per line, appended to
`{log_dir}/{run}.dispatched` (`RUN_DIR/learner/` under `searchr1 up`) after each publish returns.

The tasks stream cannot be that record on a long run: with `tasks.trim_acked_every` > 0 the entries every
consumer group has acked are deleted. The delivery audit (`audit.py`) counts as dispatched what this file
and the tasks stream hold together. A line is flushed to the operating system at once (a killed learner
loses none); a learner killed between a publish and its append leaves that task only in the stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def dispatch_log_path(log_dir: Path, run: str) -> Path:
    """Where the learner of run `run` records its dispatched task ids."""
    return Path(log_dir) / f"{run}.dispatched"


class DispatchLog:
    """Appends task ids to the run's dispatch record (blocking file writes: call from a thread)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def record(self, task_ids: Sequence[str]) -> None:
        """Append `task_ids`, one a line, and flush them to the operating system."""
        self._file.write("".join(f"{tid}\n" for tid in task_ids))
        self._file.flush()

    def close(self) -> None:
        """Close the file; what a failed write left in its buffer (a full disk) is dropped, not raised over
        the error that ended the run."""
        try:
            self._file.close()
        except OSError:
            pass


def read_dispatched(path: Path) -> list[str]:
    """The task ids recorded in `path`, in order (repeats kept; a missing file: none). A last line cut
    short by a crash is left out."""
    if not Path(path).is_file():
        return []
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    complete = lines[:-1]  # the text after the last newline is an unfinished line (or empty)
    return [line for line in complete if line]
