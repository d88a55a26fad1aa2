"""Progress for the steps of a command that can take minutes and have no count to show (a checksum, a
concatenation, a conversion): a spinner with the step's name and its elapsed time on stderr while it runs,
then one line saying it is done and how long it took. On a terminal only the spinner moves; elsewhere (a log
file, CI) only the done lines are written.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


@contextlib.contextmanager
def working(what: str, *, enabled: bool = True) -> Iterator[None]:
    """Show `what` as running for the duration of the block (see the module docstring)."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True, highlight=False)
    t0 = time.monotonic()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        progress.add_task(what, total=None)
        yield
    console.print(f"{what}: done in {time.monotonic() - t0:.1f} s", markup=False)
