"""The soak's liveness faults: the ones after which a run could make no progress while every probe stays
green unless the run answers them, each something that happens to long runs (docs/reliability.md, "Liveness"):

- `poison`: one task fails on every delivery (`rollout.poison_task` turned on for a task a worker holds,
  through the services' `FaultSwitches` directory), as a question that crashes
  the engine does: the tasks stream dead-letters it after `max_deliveries`, the dispatcher replaces it and
  never deals it out again;
- `reward_outage`: the reward service stopped (SIGSTOP: its port still accepts, nothing answers) for
  longer than three deliveries of a task, so tasks are dead-lettered and replaced, then SIGCONT;
- `bad_row`: a dataset row the wire refuses (a question over 16,384 characters) appended to the training
  data and the learner killed: its restart refuses the dataset with exit 2, `searchr1 up` stops with that
  cause instead of restarting it; the soak puts the dataset back and starts `up` again (`BadRow`);
- `disk_full`: the checkpoint volume (a tmpfs, as root) filled for a window: saves fail with ENOSPC and
  leave nothing behind, the learner exits and is restarted until the disk has room;
- `slow_checkpoint`: every file of a checkpoint written after a pause (`checkpoint.slow_write`) longer
  than half the learner's stall bound, the whole save longer than the bound: the watchdog counts the
  bytes written, so the learner is neither restarted nor stopped;
- `redis_loss`: Redis loses everything (FLUSHALL: a restore from an empty copy, a replica that had not
  caught up): the lease, the fence counter, the streams and their groups; the learner exits on its lost
  lease and resumes from its checkpoint above every token on disk;
- `idle_flood`: hundreds of connections that send half a request head and wait, to the reward service,
  the retriever and every metrics/probe port, for a window.

Each `begin_*` returns its undo (None for a fault that is over at once) and fills the fault's record.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.faults.harness import FaultRun
from tests.faults.windows import argv_of, redis_client

Undo = Callable[[], None]

POISON_SWITCH = "rollout.poison_task"
SLOW_SWITCH = "checkpoint.slow_write"
BAD_QUESTION_CHARS = 20_000
"""A question over the wire's 16,384 characters: the learner refuses the dataset at load."""


def mount_tmpfs(path: Path, size_mib: int) -> str | None:
    """A tmpfs of `size_mib` at `path` (root on Linux); None when mounted, else why not."""
    if os.name != "posix" or os.geteuid() != 0:
        return "not root"
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount -t tmpfs failed: {done.stderr.strip()}"


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def task_in_rollout(run: FaultRun) -> str | None:
    """The task id of an entry of the tasks stream a worker holds (else the newest one), None: none."""
    from searchr1.core.schemas import SchemaError, Task, decode
    from searchr1.streams import PAYLOAD_FIELD, TASKS_GROUP, StreamKeys

    client = redis_client(run)
    key = StreamKeys("faults").tasks
    try:
        pending = client.xpending_range(key, TASKS_GROUP, "-", "+", 20)
        ids = [p["message_id"] for p in pending] or [rid for rid, _ in client.xrevrange(key, count=1)]
        for mid in ids:
            rows = client.xrange(key, min=mid, max=mid)
            if rows and PAYLOAD_FIELD in rows[0][1]:
                try:
                    return decode(Task, rows[0][1][PAYLOAD_FIELD]).task_id
                except SchemaError:
                    continue
    finally:
        client.close()
    return None


def begin_poison(run: FaultRun, switches: Path, record: dict) -> Undo | None:
    """Turn `rollout.poison_task` on for a task in rollout now (one a worker holds); it stays poison."""
    task_id = task_in_rollout(run)
    if task_id is None:
        record["skipped"] = "no task on the tasks stream"
        return None
    record["task_id"] = task_id
    with (switches / POISON_SWITCH).open("a") as f:
        f.write(task_id + "\n")
    return None


def begin_reward_outage(run: FaultRun, record: dict) -> Undo | None:
    pid = run.pid("reward")
    os.kill(pid, signal.SIGSTOP)
    record["pid"] = pid

    def undo() -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:  # killed meanwhile (a kill fault): its restart runs
            pass
    return undo


def begin_disk_full(volume: Path, record: dict) -> Undo | None:
    """Fill the checkpoint volume but for a few KiB with one file (removed by the undo)."""
    filler = volume / ".soak-filler"
    st = os.statvfs(volume)
    free = st.f_bavail * st.f_frsize
    record["filled_mib"] = round(free / 2**20, 1)
    with filler.open("wb") as f:
        chunk = b"\0" * (1 << 20)
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:
            f.flush()
        except OSError:
            pass
    return lambda: filler.unlink(missing_ok=True)


def begin_slow_checkpoint(switches: Path, pause_s: float, record: dict) -> Undo | None:
    record["pause_s"] = pause_s
    (switches / SLOW_SWITCH).write_text(f"{pause_s}\n")
    return lambda: (switches / SLOW_SWITCH).unlink(missing_ok=True)


def redis_loss(run: FaultRun, record: dict) -> Undo | None:
    client = redis_client(run)
    try:
        record["keys_lost"] = int(client.dbsize())
        client.flushall()
    finally:
        client.close()
    return None


def raise_fd_limit(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = min(hard, max(soft, want)) if hard != resource.RLIM_INFINITY else max(soft, want)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return new


def flood_ports(run: FaultRun, reward_port: int, grpc_port: int) -> dict[str, int]:
    """The ports an idle flood holds connections to: the reward service, the retriever's gRPC port and every
    metrics/probe port `up` gave out."""
    ports = {"reward": reward_port, "retriever grpc": grpc_port}
    for name in ("learner", "rollout-0", "rollout-1"):
        try:
            argv = argv_of(run, name)
            ports[f"{name} metrics"] = int(argv[argv.index("--metrics-port") + 1])
        except (KeyError, ValueError, OSError, json.JSONDecodeError):
            continue
    return ports


def begin_idle_flood(ports: dict[str, int], per_port: int, record: dict) -> Undo | None:
    """`per_port` connections to each port (the probe ports get 4× their bound of 16), each holding half a
    request head; the undo closes them."""
    raise_fd_limit(sum(per_port if "metrics" not in n else 64 for n in ports) + 256)
    socks: list[socket.socket] = []
    opened: dict[str, int] = {}
    for name, port in ports.items():
        n = 64 if "metrics" in name else per_port
        opened[name] = 0
        for _ in range(n):
            s = socket.socket()
            s.settimeout(1.0)
            try:
                s.connect(("127.0.0.1", port))
                if "grpc" not in name:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: soak\r\n")  # half a head, never finished
            except OSError:
                s.close()
                continue
            socks.append(s)
            opened[name] += 1
    record["connections"] = opened

    def undo() -> None:
        for s in socks:
            s.close()
    return undo


class BadRow:
    """The training data with one row the wire refuses appended, and put back."""

    def __init__(self, dataset: Path) -> None:
        self.dataset = dataset
        self.backup = dataset.with_name(dataset.name + ".soak-good")

    def begin(self, run: FaultRun, record: dict) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.backup.exists():
            shutil.copy2(self.dataset, self.backup)
        table = pq.read_table(self.backup)
        row = {name: [table.column(name)[0].as_py()] for name in table.column_names}
        bad_id = f"soak_bad_row_{table.num_rows}"
        for key in ("id", "task_id"):
            if key in row:
                row[key] = [bad_id]
        if "question" not in row:
            raise AssertionError(f"{self.dataset} has no question column: {table.column_names}")
        row["question"] = ["x" * BAD_QUESTION_CHARS]
        bad = pa.concat_tables([table, pa.Table.from_pydict(row, schema=table.schema)])
        tmp = self.dataset.with_name(".soak-" + self.dataset.name)
        pq.write_table(bad, tmp)
        tmp.replace(self.dataset)
        record["row"] = table.num_rows
        pid = run.pid("learner")
        os.kill(pid, signal.SIGKILL)  # its restart reads the data again
        record["pid"] = pid

    def restore(self) -> None:
        if self.backup.exists():
            shutil.copy2(self.backup, self.dataset)


WINDOWS = {"reward_outage": "reward_outage_s", "disk_full": "disk_full_s", "slow_checkpoint": "slow_checkpoint_s",
           "idle_flood": "idle_flood_s"}
"""The liveness faults that are windows, and the `[soak]` key of their length range."""
KINDS = ("poison", "reward_outage", "bad_row", "disk_full", "slow_checkpoint", "redis_loss", "idle_flood")


class LivenessFaults:
    """The liveness faults of one soak: their switches directory, the checkpoint volume, the dataset."""

    def __init__(self, settings, out: Path, dataset: Path) -> None:
        self.s = settings
        self.switches = out / "switches"
        self.bad_row = BadRow(dataset)
        self.volume: Path | None = None
        self.volume_note = ""
        self.ports: dict[str, int] = {}

    def setup(self, run_dir: Path, reward_port: int, grpc_port: int) -> dict[str, str]:
        """Before `up` starts: the switches directory and, as root, the checkpoint volume (a tmpfs); returns
        the environment that arms every service's switches."""
        self.ports = {"reward": reward_port, "grpc": grpc_port}
        if self.switches.exists():
            shutil.rmtree(self.switches)
        self.switches.mkdir(parents=True)
        volume = run_dir / "checkpoints"
        why = mount_tmpfs(volume, self.s.checkpoint_volume_mib)
        if why is None:
            self.volume = volume
            self.volume_note = f"checkpoints on a {self.s.checkpoint_volume_mib} MiB tmpfs"
        else:
            self.volume_note = f"no disk_full faults: {why}"
        return {"SEARCHR1_FAULT_SWITCHES": str(self.switches)}

    def unavailable(self, kind: str) -> str | None:
        return self.volume_note if kind == "disk_full" and self.volume is None else None

    def begin(self, kind: str, run: FaultRun, record: dict) -> Undo | None:
        if kind == "poison":
            return begin_poison(run, self.switches, record)
        if kind == "reward_outage":
            return begin_reward_outage(run, record)
        if kind == "bad_row":
            self.bad_row.begin(run, record)
            return None
        if kind == "disk_full":
            assert self.volume is not None
            return begin_disk_full(self.volume, record)
        if kind == "slow_checkpoint":
            return begin_slow_checkpoint(self.switches, self.s.slow_checkpoint_pause_s, record)
        if kind == "redis_loss":
            return redis_loss(run, record)
        if kind == "idle_flood":
            ports = flood_ports(run, self.ports["reward"], self.ports["grpc"])
            return begin_idle_flood(ports, self.s.idle_flood_connections, record)
        raise ValueError(f"unknown liveness fault {kind!r}")

    def close(self) -> None:
        self.bad_row.restore()
        if self.volume is not None:
            unmount(self.volume)
            self.volume = None
