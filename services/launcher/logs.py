"""The log multiplexer: every process's stdout and stderr, line by line, into its own
`RUN_DIR/logs/<name>.log` (everything, as written) and onto one coloured console stream with a `name │`
prefix (rich) — all of it with `verbose`, otherwise only the lines that matter to a person.

What matters (`ConsoleFilter`, per pipe, since a traceback spans lines): the WARNING and above of this
system's own loggers (`searchr1.*`), ERROR and CRITICAL lines of anyone, and Python tracebacks with their
exception lines. Everything else — third-party INFO and WARNING lines (vLLM's start-up, Triton, NUMA,
uvicorn's access log, Redis's banner), deprecation warnings, progress bars — stays in the files only.
A process exiting is the supervisor's to report (with the tail of its file).

Lines are split on `\\n`; for the console a line holding carriage returns (progress bars) shows only its
last segment, while the file keeps the line as written. Reading is chunked, so a very long line never
stalls a pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import deque
from pathlib import Path
from typing import BinaryIO

from rich.console import Console
from rich.text import Text

PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green",
           "bright_yellow", "bright_blue")
LAUNCHER = "launcher"
_CHUNK = 64 * 1024


def split_lines(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without their `\\n` or a trailing `\\r`) and the unfinished remainder."""
    *lines, rest = buffer.split(b"\n")
    return [line.rstrip(b"\r") for line in lines], rest


def console_text(line: bytes) -> str:
    """What the console shows of one line: its last carriage-return segment, decoded leniently."""
    segments = [s for s in line.split(b"\r") if s.strip()]
    return (segments[-1] if segments else b"").decode("utf-8", errors="replace")


_LEVEL = re.compile(r"(?<![\w.-])(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?![\w.-])")
_OWN_LOGGER = re.compile(r"^:?\s+searchr1(?:[.:\s]|$)")
_WORKER_PREFIX = re.compile(r"^\((?:[\w-]+ )?pid=\d+\)\s?")
_SEVERE = frozenset({"ERROR", "CRITICAL", "FATAL"})
TRACEBACK = "Traceback (most recent call last):"


def line_level(text: str) -> tuple[str | None, bool]:
    """The first logging level word of a line (`WARNING`, `ERROR`...; None if none) and whether the logger
    named right after it is one of this system's (`... WARNING searchr1.rollout.worker: ...`)."""
    match = _LEVEL.search(text)
    if match is None:
        return None, False
    return match.group(1), bool(_OWN_LOGGER.match(text[match.end():]))


def worth_showing(text: str) -> bool:
    """Whether one (non-traceback) line belongs on the quiet console: our WARNING and above, anyone's ERROR."""
    level, own = line_level(text)
    if level in _SEVERE:
        return True
    return own and level in ("WARNING", "WARN")


class ConsoleFilter:
    """Decides, line by line, what of one pipe reaches the quiet console (see the module docstring).

    A traceback is shown whole: the `Traceback (most recent call last):` line, its indented frames, the
    exception line and that line's indented continuation (a pydantic error's details, say). A vLLM worker's
    `(EngineCore pid=N) ` prefix is looked through."""

    def __init__(self) -> None:
        self._state = "idle"  # idle | frames | detail

    def __call__(self, text: str) -> bool:
        body = _WORKER_PREFIX.sub("", text)
        if body.startswith(TRACEBACK):
            self._state = "frames"
            return True
        indented = body[:1].isspace()
        if self._state == "frames":
            if not indented:  # the exception line ends the frames
                self._state = "detail"
            return True
        if self._state == "detail":
            if indented and body.strip():
                return True
            self._state = "idle"
        return worth_showing(body)


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a text file ([] if it does not exist)."""
    if lines <= 0 or not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 256 * 1024))
        data = f.read()
    return [b.decode("utf-8", errors="replace") for b in deque(data.splitlines(), maxlen=lines)]


class LogMux:
    """Prefixes, colours and fans out process output; the launcher's own messages go through `say`."""

    def __init__(self, console: Console, log_dir: Path, names: list[str], *, verbose: bool = False) -> None:
        self.console = console
        self.log_dir = log_dir
        self.verbose = verbose
        """Stream every line to the console (else only what `ConsoleFilter` keeps)."""
        self.width = max([len(LAUNCHER), *(len(n) for n in names)])
        self._styles = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
        self._styles[LAUNCHER] = "bold white"
        self._files: dict[str, BinaryIO] = {}
        self._dropping: dict[str, int] = {}
        """Lines of each process's output that could not be written to its log since the last write that
        succeeded."""

    def _dropped(self, name: str, lines: int, exc: OSError) -> None:
        first = name not in self._dropping
        self._dropping[name] = self._dropping.get(name, 0) + lines
        if first:
            self.say(f"cannot write the log of {name} ({exc.strerror or exc}): its lines are dropped until "
                     "a write succeeds", "bold red")

    def _written(self, name: str) -> None:
        lost = self._dropping.pop(name, None)
        if lost is not None:
            self.say(f"writing the log of {name} again; {lost} line(s) were dropped", "yellow")

    def path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def open(self, name: str) -> BinaryIO:
        """Open (append) the process's log file."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        f = self.path(name).open("ab")
        self._files[name] = f
        return f

    def close(self, name: str) -> None:
        f = self._files.pop(name, None)
        if f is not None:
            with contextlib.suppress(OSError):  # what a full disk kept in its buffer is lost
                f.close()

    def close_all(self) -> None:
        for name in list(self._files):
            self.close(name)

    def prefix(self, name: str) -> Text:
        return Text(f"{name:>{self.width}} │ ", style=self._styles.get(name, "white"))

    def emit(self, name: str, text: str, style: str | None = None) -> None:
        """Print one line with the process's prefix."""
        body = Text.from_ansi(text)
        if style:
            body.stylize(style)
        self.console.print(self.prefix(name) + body, soft_wrap=True, highlight=False)

    def say(self, message: str, style: str | None = None) -> None:
        """A message of the launcher itself (one prefixed line per message line)."""
        for line in message.splitlines() or [""]:
            self.emit(LAUNCHER, line, style)

    def say_tail(self, name: str, lines: int) -> None:
        """The last `lines` lines of `name`'s log, as the launcher's own (red) messages."""
        path = self.path(name)
        last = tail(path, lines)
        if last:
            self.say(f"last {len(last)} lines of {path}:", "red")
            for line in last:
                self.say(f"  {line}", "red")

    async def pump(self, name: str, stream: asyncio.StreamReader) -> None:
        """Copy one pipe to the process's log file (all of it) and the console (all of it when verbose, else
        what a `ConsoleFilter` keeps) until EOF."""
        f = self._files.get(name) or self.open(name)
        keep = ConsoleFilter()
        rest = b""
        while True:
            chunk = await stream.read(_CHUNK)
            if not chunk:
                break
            lines, rest = split_lines(rest + chunk)
            self._write(name, f, lines, keep)
            if len(rest) > 1024 * 1024:  # an endless line: flush it as is
                self._write(name, f, [rest], keep)
                rest = b""
        if rest:
            self._write(name, f, [rest.rstrip(b"\r")], keep)

    def _write(self, name: str, f: BinaryIO, lines: list[bytes], keep: ConsoleFilter) -> None:
        if not lines:
            return
        if not f.closed:
            try:
                f.write(b"".join(line + b"\n" for line in lines))
                f.flush()
            except OSError as exc:  # a full disk: the lines are lost, the pipe is still drained
                self._dropped(name, len(lines), exc)
            else:
                self._written(name)
        for line in lines:
            text = console_text(line)
            if text and (keep(text) or self.verbose):
                self.emit(name, text)
