"""How the launcher stops a process that owns a child (as a rollout worker owns its vLLM engine), with
real processes: SIGTERM goes to the process itself, which shuts its child down and exits 0; the child
never gets the signal in the middle of its work. A child the leader leaves behind is SIGTERMed once the
leader is gone."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time

from searchr1.launcher.processes import Running, group_alive, terminate_group
from searchr1.launcher.specs import ProcessSpec

LEADER = textwrap.dedent("""
    import signal, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1], sys.argv[3]], stdin=subprocess.PIPE)
    def stop(signum, frame):
        if sys.argv[3] == "owns":
            child.stdin.close()  # the leader shuts its child down itself
            child.wait()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    import os, time
    while not os.path.exists(sys.argv[1] + ".ready"):  # the child has its handler
        time.sleep(0.01)
    print("ready", flush=True)
    signal.pause()
""")
CHILD = textwrap.dedent("""
    import signal, sys
    out = open(sys.argv[1], "a")
    def term(signum, frame):
        out.write("child got SIGTERM\\n"); out.flush(); sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    open(sys.argv[1] + ".ready", "w").close()
    if sys.argv[2] == "owns":
        sys.stdin.read()  # until the leader closes it
        out.write("child closed by its leader\\n"); out.flush()
    else:
        signal.pause()  # works until signalled
""")


async def _stop(tmp_path, mode: str) -> tuple[int, str]:
    record = tmp_path / f"{mode}.txt"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", LEADER, str(record), CHILD, mode,
                                                stdout=asyncio.subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
    run = Running(ProcessSpec(name="owner", argv=[], stage="s", health_timeout_s=60.0), proc, time.monotonic())
    await terminate_group(run, 20.0, asyncio.Event(), lambda *a, **k: None)
    for _ in range(200):  # the group's last member may still be exiting
        if not group_alive(proc.pid):
            break
        await asyncio.sleep(0.05)
    return proc.returncode, record.read_text() if record.exists() else ""


async def test_the_leader_alone_gets_sigterm_and_stops_its_child(tmp_path):
    code, record = await _stop(tmp_path, "owns")
    assert code == 0 and record == "child closed by its leader\n"


async def test_a_child_left_behind_gets_sigterm_after_its_leader(tmp_path):
    code, record = await _stop(tmp_path, "leaves")
    assert code == 0 and record == "child got SIGTERM\n"
