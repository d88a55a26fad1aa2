"""The log multiplexer: line splitting, carriage returns, prefixes, per-process files, tails, the quiet
console's filter (on lines captured from a real `searchr1 up` of the tiny world: vLLM CPU, uvicorn, Redis,
the learner); and exit codes."""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console

from searchr1.launcher.logs import (
    ConsoleFilter,
    LogMux,
    console_text,
    line_level,
    split_lines,
    tail,
    worth_showing,
)
from searchr1.launcher.processes import exit_code_of


def test_split_lines_keeps_the_unfinished_rest():
    assert split_lines(b"a\nb\r\nc") == ([b"a", b"b"], b"c")
    assert split_lines(b"") == ([], b"")
    assert split_lines(b"x\n") == ([b"x"], b"")


def test_console_text_shows_the_last_carriage_return_segment():
    assert console_text(b" 10%\r 50%\r100%") == "100%"
    assert console_text(b"done\r   \r") == "done"
    assert console_text(b"caf\xc3\xa9 \xff") == "café \ufffd"
    assert console_text(b"") == ""


def test_tail(tmp_path):
    path = tmp_path / "x.log"
    assert tail(path, 3) == []
    path.write_text("".join(f"line {i}\n" for i in range(10)))
    assert tail(path, 3) == ["line 7", "line 8", "line 9"]
    assert tail(path, 0) == []


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=120, force_terminal=False, color_system=None), buf


async def test_pump_prefixes_lines_and_writes_the_file(tmp_path):
    console, buf = _console()
    mux = LogMux(console, tmp_path / "logs", ["retriever", "rollout-10"], verbose=True)
    reader = asyncio.StreamReader()
    reader.feed_data(b"hello\npart")
    reader.feed_data(b"ial line\nprogress 1%\rprogress 100%\n\x1b[32mgreen\x1b[0m\nno newline at end")
    reader.feed_eof()
    await mux.pump("retriever", reader)
    mux.close_all()
    width = len("rollout-10")
    assert buf.getvalue().splitlines() == [
        f"{'retriever':>{width}} │ hello",
        f"{'retriever':>{width}} │ partial line",
        f"{'retriever':>{width}} │ progress 100%",
        f"{'retriever':>{width}} │ green",
        f"{'retriever':>{width}} │ no newline at end",
    ]
    assert (tmp_path / "logs" / "retriever.log").read_bytes() == (
        b"hello\npartial line\nprogress 1%\rprogress 100%\n\x1b[32mgreen\x1b[0m\nno newline at end\n")


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
async def test_a_log_that_cannot_be_written_drops_its_lines_and_the_pipe_is_still_drained(tmp_path):
    # /dev/full answers every write with ENOSPC, as a full disk does: the pump says so once and reads on,
    # so the process behind the pipe never blocks on a full pipe
    console, buf = _console()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "learner.log").symlink_to("/dev/full")
    mux = LogMux(console, tmp_path / "logs", ["learner"])
    reader = asyncio.StreamReader()
    for i in range(200):
        reader.feed_data(f"line {i}\n".encode() * 100)
    reader.feed_eof()
    await asyncio.wait_for(mux.pump("learner", reader), 10)
    assert reader.at_eof()
    said = buf.getvalue()
    assert said.count("cannot write the log of learner (No space left on device): its lines are dropped") == 1
    assert mux._dropping["learner"] == 200 * 100
    mux.close_all()  # the buffer a full disk kept is dropped, not raised


async def test_say_prefixes_every_line(tmp_path):
    console, buf = _console()
    mux = LogMux(console, tmp_path, ["a"])
    mux.say("one\ntwo")
    assert buf.getvalue().splitlines() == ["launcher │ one", "launcher │ two"]


def test_exit_code_of():
    assert exit_code_of(0) == 0
    assert exit_code_of(3) == 3
    assert exit_code_of(-15) == 143
    assert exit_code_of(-9) == 137


# Captured from RUN_DIR/logs of `searchr1 up --config configs/tiny-cpu.toml` (vLLM 0.32 CPU, uvicorn, Redis 6).
NOISE = [
    "2026-11-24 04:52:19,583 WARNING vllm.triton_utils.importing: Triton is installed, but doesn't include CPU "
    "backend. Disabling Triton.",
    "2026-11-24 04:52:19,583 INFO vllm.triton_utils.importing: Triton is installed but 0 active driver(s) found "
    "(expected 1). Disabling Triton to prevent runtime errors.",
    "(MainProcess pid=8539) INFO 11-24 04:52:37 [model.py:733] Resolved architecture: Qwen2ForCausalLM",
    "(MainProcess pid=8539) WARNING 11-24 04:52:37 [arg_utils.py:3005] This model does not officially support "
    "disabling chunked prefill. Disabling this manually may cause the engine to crash or produce incorrect outputs.",
    "(MainProcess pid=8539) WARNING 11-24 04:52:37 [cpu.py:224] Triton is not installed. triton-cpu is expected "
    "on x86 CPUs.",
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "(EngineCore pid=10997) INFO 11-24 04:52:48 [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=[0]",
    "/work/main/.venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: "
    "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead",
    '  if hasattr(value, "__dict__"):',
    "[W1124 04:52:58.533625972 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation "
    "on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. "
    "(function init_cpu_memory_env)",
    "(Worker pid=11582) WARNING 11-24 04:52:58 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For "
    "best performance, please follow the section `set LD_PRELOAD`",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 131.12it/s]",
    "(MainProcess pid=8539) WARNING 11-24 04:53:02 [input_processor.py:408] Passing raw prompts to "
    "InputProcessor is deprecated and will be removed in the future.",
    "/root/.pyenv/versions/3.11.7/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: "
    "resource_tracker: There appear to be 1 leaked shared_memory objects to clean up at shutdown",
    "INFO:     Started server process [8506]",
    "INFO:     127.0.0.1:51234 - \"POST /score HTTP/1.1\" 200 OK",
    "7130:M 24 Nov 2026 04:51:31.084 # WARNING Memory overcommit must be enabled! Without it, a background save "
    "or replication may fail under low memory condition.",
    "7130:M 24 Nov 2026 04:51:31.084 * Ready to accept connections",
    "2026-11-24 04:52:19,584 INFO searchr1.rollout: rollout worker rollout-0 ready: run=tiny-cpu",
    "2026-11-24 04:53:29,333 searchr1.learner step 1: loss 0.1412 reward 0.244 4567 tok/s",
    "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 37.16it/s]",
    "searchr1 reward service ready on http://127.0.0.1:47009 (scorers: composite, exact_match)",
]
MATTERS = [
    "2026-11-24 04:53:02,303 WARNING searchr1.rollout: weight update v3 failed; keeping v2",
    "2026-11-24 04:53:02,303 ERROR searchr1.retriever: index load failed",
    "2026-11-24 04:53:02,303 CRITICAL searchr1.learner.train.trainer: NaN loss",
    "(EngineCore pid=10997) ERROR 11-24 04:53:02 [core.py:700] EngineCore encountered a fatal error.",
    "ERROR:    Exception in ASGI application",
]


def test_line_level_reads_the_level_and_whose_logger():
    assert line_level(MATTERS[0]) == ("WARNING", True)
    assert line_level(NOISE[0]) == ("WARNING", False)
    assert line_level(NOISE[2]) == ("INFO", False)
    assert line_level("INFO:     Started server process [8506]") == ("INFO", False)
    assert line_level("2026-11-24 04:52:19,584 INFO searchr1.rollout: ready") == ("INFO", True)
    assert line_level("no level here; WARNINGS_ENABLED=1 is not one") == (None, False)


@pytest.mark.parametrize("line", NOISE)
def test_the_quiet_console_drops_third_party_noise(line):
    assert not worth_showing(line)
    assert not ConsoleFilter()(line)


@pytest.mark.parametrize("line", MATTERS)
def test_the_quiet_console_keeps_our_warnings_and_anyones_errors(line):
    assert worth_showing(line)
    assert ConsoleFilter()(line)


def test_a_traceback_is_kept_whole_and_the_filter_recovers_after_it():
    lines = [
        "(EngineCore pid=10997) INFO 11-24 04:52:48 [core.py:133] Initializing a V1 LLM engine",
        "Traceback (most recent call last):",
        '  File "/srv/services/rollout/worker.py", line 88, in run',
        "    await self.engine.generate(batch)",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for Trajectory",
        "reward",
        "  Input should be a valid number [type=float_parsing]",
        "(EngineCore pid=10997) INFO 11-24 04:53:40 [core.py:1499] [shutdown] EngineCore: exiting busy loop",
        "(EngineCore pid=10997) Traceback (most recent call last):",
        '(EngineCore pid=10997)   File "vllm/v1/engine/core.py", line 12, in run',
        "(EngineCore pid=10997) RuntimeError: boom",
        "(MainProcess pid=8539) INFO 11-24 04:53:41 [core_client.py:777] [shutdown] MPClient: complete",
        "  warnings.warn('resource_tracker: There appear to be %d '",
    ]
    keep = ConsoleFilter()
    assert [line for line in lines if keep(line)] == [
        lines[1], lines[2], lines[3], lines[4], lines[8], lines[9], lines[10]]


def test_the_exception_details_that_follow_are_kept():
    keep = ConsoleFilter()
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
             "ValueError: bad config", "  details: port out of range", "INFO:     Shutting down"]
    assert [keep(line) for line in lines] == [True, True, True, True, False]


def _feed(lines: list[str]) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data("".join(line + "\n" for line in lines).encode())
    reader.feed_eof()
    return reader


@pytest.mark.parametrize("verbose", [False, True])
async def test_the_file_keeps_everything_the_console_what_matters_unless_verbose(tmp_path, verbose):
    console, buf = _console()
    mux = LogMux(console, tmp_path, ["rollout-0"], verbose=verbose)
    lines = NOISE + MATTERS
    await mux.pump("rollout-0", _feed(lines))
    mux.close_all()
    assert (tmp_path / "rollout-0.log").read_text().splitlines() == lines
    shown = [" ".join(line.split(" │ ", 1)[1].split()) for line in buf.getvalue().splitlines()]  # tabs expand
    assert shown == [" ".join(line.split()) for line in (lines if verbose else MATTERS)]
