"""The soak: a randomised chaos run of the tiny world that a user starts and leaves (`make soak`).

The fault harness's run (`tests/faults/harness.py`: `searchr1 up` with real Redis and its append-only
file, the BM25 retriever, the reward service, two rollout workers on the transformers engine, the learner)
trains for `duration_s` while, every `fault_interval_s` ± `fault_jitter_s`, one fault drawn at random
(seeded) hits it:

- `kill`: `kill -9` of one service (a rollout worker, the learner, the retriever, the reward service or
  Redis); `searchr1 up`'s supervisor restarts it, as in production;
- `partition`: one link stops carrying bytes for `partition_s` (a random span);
- `slow`: one link gets `slow_latency_ms` and `slow_loss` for `slow_s`.

Every client connection of the run goes through a link (`tests/faults/chaos_proxy.py`, always adding
`latency_ms` ± `jitter_ms` and `loss`): each worker's to Redis, the retriever and the reward service, the
learner's to Redis. On Linux as root the links cross network namespaces joined by veth pairs
(`tests/faults/netns.py`) and a partition takes the link's veth down; otherwise a partition pauses the
proxy (the report says which, and why).

When the time is up, faults stop, the run is given `settle_s` to log one more step, `searchr1 up` is
stopped with SIGINT, and `searchr1 audit` accounts for every task. The report (`OUT/soak.json`) and the
plot (`OUT/soak.png`) hold the curves of `tests/faults/soak_curves.py`. The exit status is 1 when a task
was lost or trained twice, the audit is not ok, an RSS slope exceeds `rss_slope_bound_mib_per_h`, or the
run itself died.

    python -m tests.faults.soak --config configs/soak.toml [--duration-s S] [--seed N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.faults import soak_curves as curves
from tests.faults import soak_faults, soak_report
from tests.faults.chaos_proxy import ChaosProxy, LinkShape
from tests.faults.harness import FaultRun, build_world, run_config
from tests.faults.soak_links import Link, Links, Sampler, disk_used, rss_of
from tests.faults.soak_signals import Signals, scrape
from tests.faults.windows import free_port, free_port_block, redis_password

KILL_TARGETS = ("rollout-0", "rollout-1", "learner", "retriever", "reward", "redis")


@dataclass
class SoakSettings:
    """The `[soak]` table of configs/soak.toml (every key optional)."""

    duration_s: float = 3600.0
    seed: int = 0
    fault_interval_s: float = 60.0
    fault_jitter_s: float = 30.0
    first_fault_after_steps: int = 1
    """Faults begin once the learner has logged this many steps (start-up is not soaked)."""
    kinds: dict[str, float] = field(default_factory=lambda: {"kill": 6.0, "partition": 2.0, "slow": 1.0})
    """Relative weights of the fault kinds."""
    kill_targets: list[str] = field(default_factory=lambda: list(KILL_TARGETS))
    partition_s: tuple[float, float] = (10.0, 40.0)
    slow_s: tuple[float, float] = (20.0, 60.0)
    slow_latency_ms: float = 150.0
    slow_loss: float = 0.05
    latency_ms: float = 1.0
    jitter_ms: float = 1.0
    loss: float = 0.002
    netns: bool = True
    """Spread the links over network namespaces when running as root on Linux."""
    sample_s: float = 5.0
    rss_warmup_s: float = 300.0
    rss_slope_bound_mib_per_h: float = 64.0
    rss_min_fit_s: float = 600.0
    """A process's RSS slope is judged against the bound only when fitted on this many seconds of samples
    after warm-up: over a few minutes RSS moves by ±10 MiB with the allocator and caches alone."""
    settle_s: float = 900.0
    stall_bound_s: float = 300.0
    """A span longer than this with no training step and no signal is a silent stall (`soak_signals`)."""
    reward_outage_s: tuple[float, float] = (90.0, 150.0)
    disk_full_s: tuple[float, float] = (20.0, 60.0)
    slow_checkpoint_s: tuple[float, float] = (60.0, 150.0)
    """How long checkpoints are slow: every checkpoint started in it pauses before each of its files …"""
    slow_checkpoint_pause_s: float = 50.0
    """… this long (less than the learner's stall bound, three of them more)."""
    idle_flood_s: tuple[float, float] = (20.0, 60.0)
    idle_flood_connections: int = 300
    """Idle connections to the reward service and the retriever each (64 to each metrics port)."""
    checkpoint_volume_mib: int = 64
    """The tmpfs the checkpoints are on (as root), which `disk_full` fills."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment of `searchr1 up` (and so of every service): the run's sizing for a shared machine."""

    @classmethod
    def load(cls, path: Path | None) -> SoakSettings:
        table = tomllib.loads(path.read_text()).get("soak", {}) if path else {}
        unknown = set(table) - set(cls.__dataclass_fields__)
        if unknown:
            raise SystemExit(f"{path}: unknown [soak] keys {sorted(unknown)}")
        for key in ("partition_s", "slow_s", *soak_faults.WINDOWS.values()):
            if key in table:
                table[key] = tuple(table[key])
        strange = set(table.get("kinds", {})) - {"kill", "partition", "slow", *soak_faults.KINDS}
        if strange:
            raise SystemExit(f"{path}: unknown fault kinds {sorted(strange)}")
        return cls(**table)


class Soak:
    def __init__(self, settings: SoakSettings, out: Path, config_path: Path | None) -> None:
        self.s, self.out, self.config_path = settings, out, config_path
        self.rng = random.Random(settings.seed)
        self.faults: list[dict] = []
        self.windows: list[tuple[float, str, object]] = []  # (end time, link name, undo)
        self.hosts = None
        self.netns_note = ""
        self.links = Links()
        self.sampler = Sampler(time.time())
        self.redis_port = free_port()
        self.password: str | None = None
        self.chaos_t0: float | None = None
        """When faults began (the first step): `duration_s` counts from here."""
        self.liveness: soak_faults.LivenessFaults | None = None
        self.signals = Signals()
        self.env: dict[str, str] = {}
        self.bad_row_at: float | None = None
        """When a bad dataset row was put in: `up` must stop with exit 2 naming it."""

    # -- set-up -------------------------------------------------------------------------------------------
    def _link(self, name: str, target_port: int, port: int = 0) -> int:
        """A link to `127.0.0.1:target_port` (through its host's namespace when there are hosts), listening
        on `port` (0: a free one); returns the port."""
        shape = LinkShape(self.s.latency_ms, self.s.jitter_ms, self.s.loss)
        proxy = ChaosProxy(("127.0.0.1", target_port), port=port, shape=shape, seed=self.rng.randrange(1 << 30))
        veth = None
        if self.hosts is not None:
            proxy.target, veth = self.hosts.route(name, target_port)
        return self.links.add(name, proxy, veth).proxy.port

    def setup(self) -> FaultRun:
        from tests.faults.netns import Hosts, netns_unavailable

        self.out.mkdir(parents=True, exist_ok=True)
        world = build_world(self.out / "world") if not (self.out / "world" / "train.parquet").is_file() \
            else self.out / "world"
        reason = netns_unavailable() if self.s.netns else "disabled in the soak config (netns = false)"
        if reason is None:
            self.hosts = Hosts(self.out.name, loop=self.links.loop)
            self.hosts.create(["w0", "w1", "learner"])
            self.netns_note = f"links cross network namespaces {', '.join(self.hosts.namespaces())} (veth)"
        else:
            self.netns_note = f"links on loopback only: {reason}"
        print(f"soak: {self.netns_note}", flush=True)
        grpc, reward = free_port(), free_port()
        rng = random.Random(self.s.seed + 1)
        prefixes = {}
        for kind, target in (("redis", self.redis_port), ("retriever", grpc), ("reward", reward)):
            prefixes[kind] = free_port_block(rng)
            for i in range(2):
                self._link(f"w{i}-{kind}", target, prefixes[kind] * 10 + i)
        learner_port = self._link("learner-redis", self.redis_port)
        templates = {"rollout": ["serve", "rollout", "--config", "{config}", "--worker-id", "{worker_id}",
                                 "--run", "{run}", "--retriever", f"127.0.0.1:{prefixes['retriever']}{{worker_index}}",
                                 "--reward", f"http://127.0.0.1:{prefixes['reward']}{{worker_index}}",
                                 "--metrics-port", "{metrics_port}"]}
        extra = "\n[launcher.templates]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in templates.items())
        rollout_env = {"ROLLOUT_REDIS__URL": f"redis://:{{redis_password}}@127.0.0.1:{prefixes['redis']}{{worker_index}}/0"}
        learner_env = {"LEARNER_REDIS__URL": f"redis://:{{redis_password}}@127.0.0.1:{learner_port}/0"}
        cfg = run_config(self.out, world, steps=1_000_000, redis_port=self.redis_port, extra_toml=extra,
                         rollout_env=rollout_env, learner_env=learner_env)
        run = FaultRun(self.out, cfg, 1_000_000)
        run_dir = self.out / "run"
        if run_dir.exists():
            soak_faults.unmount(run_dir / "checkpoints")
            shutil.rmtree(run_dir)
        self.liveness = soak_faults.LivenessFaults(self.s, self.out, world / "train.parquet")
        armed = self.liveness.setup(run_dir, reward, grpc)
        print(f"soak: {self.liveness.volume_note}", flush=True)
        self.env = {**self.s.env, **armed, "LAUNCHER_RETRIEVER__GRPC_PORT": str(grpc),
                    "LAUNCHER_REWARD__PORT": str(reward)}
        run.start(env=self.env)
        return run

    # -- faults -------------------------------------------------------------------------------------------
    def _pick(self) -> tuple[str, str]:
        kinds = [k for k in self.s.kinds if self.liveness is None or self.liveness.unavailable(k) is None]
        kind = self.rng.choices(kinds, weights=[self.s.kinds[k] for k in kinds])[0]
        if kind == "kill":
            return kind, self.rng.choice(self.s.kill_targets)
        if kind in soak_faults.KINDS:  # one window of each liveness kind at a time
            if any(target == kind for _, target, _ in self.windows):
                return "kill", self.rng.choice(self.s.kill_targets)
            return kind, kind
        # one window at a time per link, and per host's veth (a partition takes all of a host's links down)
        busy = {name for _, name, _ in self.windows if name in self.links.links}
        busy_veths = {self.links.links[n].veth for n in busy} - {None}
        free = [n for n, link in self.links.links.items() if n not in busy and link.veth not in busy_veths]
        if not free:
            return "kill", self.rng.choice(self.s.kill_targets)
        return kind, self.rng.choice(sorted(free))

    def inject(self, run: FaultRun) -> None:
        kind, target = self._pick()
        t = self.sampler.now()
        record: dict = {"t": t, "wall": time.time(), "kind": kind, "target": target,
                        "steps_before": len(self.sampler.step_times)}
        if kind == "kill":
            try:
                pid = run.pid(target)
                os.kill(pid, signal.SIGKILL)
                record["pid"] = pid
            except (ProcessLookupError, KeyError, FileNotFoundError, json.JSONDecodeError) as exc:
                record["skipped"] = f"no process to kill: {exc!r}"
        elif kind in soak_faults.KINDS:
            assert self.liveness is not None
            try:
                undo = self.liveness.begin(kind, run, record)
            except (OSError, KeyError, ValueError, json.JSONDecodeError, redis.RedisError) as exc:
                undo, record["skipped"] = None, f"could not inject it: {exc!r}"
            if undo is not None:
                hold = self.rng.uniform(*getattr(self.s, soak_faults.WINDOWS[kind]))
                record["hold_s"] = hold
                self.windows.append((time.time() + hold, target, undo))
            if kind == "bad_row" and "skipped" not in record:
                self.bad_row_at = time.time()
        else:
            link = self.links.links[target]
            span = self.s.partition_s if kind == "partition" else self.s.slow_s
            hold = self.rng.uniform(*span)
            record["hold_s"] = hold
            if kind == "partition":
                undo = self._partition(link)
                record["how"] = f"veth {link.veth} down" if link.veth else "proxy paused"
            else:
                undo = self._slow(link)
            self.windows.append((time.time() + hold, target, undo))
        self.faults.append(record)
        print(f"soak: {t / 60:6.1f} min  {kind:9s} {target}  {record.get('skipped', '')}", flush=True)

    def _partition(self, link: Link):
        if link.veth and self.hosts is not None:
            self.hosts.link(link.veth, up=False)
            return lambda: self.hosts.link(link.veth, up=True)
        self.links.call(link.proxy.pause)
        return lambda: self.links.call(link.proxy.resume)

    def _slow(self, link: Link):
        shape = link.proxy.shape
        before = (shape.latency_ms, shape.loss)

        def apply(latency: float, loss: float) -> None:
            shape.latency_ms, shape.loss = latency, loss
        self.links.call(apply, self.s.slow_latency_ms, self.s.slow_loss)
        return lambda: self.links.call(apply, *before)

    def end_windows(self, all_of_them: bool = False) -> None:
        now = time.time()
        for window in [w for w in self.windows if all_of_them or w[0] <= now]:
            window[2]()
            self.windows.remove(window)

    # -- sampling -----------------------------------------------------------------------------------------
    def sample(self, run: FaultRun) -> None:
        import redis

        t = self.sampler.now()
        self.sampler.disk.append((t, disk_used(run.run_dir)))
        try:
            table = json.loads((run.run_dir / "processes.json").read_text())
        except (OSError, ValueError):
            table = {}
        procs = {name: entry["pid"] for name, entry in table.items()
                 if isinstance(entry, dict) and "pid" in entry and name != "index-build"}  # one-shot: its pid is reused
        procs["launcher"] = run.proc.pid if run.proc else 0
        procs["soak"] = os.getpid()
        for name, pid in procs.items():
            if (rss := rss_of(pid)) is not None:
                self.sampler.rss.append(curves.RssSample(t, name, pid, rss))
        for name in procs:
            argv = table.get(name, {}).get("argv", []) if isinstance(table.get(name), dict) else []
            if "--metrics-port" in argv and (name == "learner" or name.startswith("rollout")):
                self.signals.add(t, name, scrape(int(argv[argv.index("--metrics-port") + 1])))
        if self.password is None:
            self.password = redis_password(run)
        try:
            client = redis.Redis(port=self.redis_port, password=self.password, socket_timeout=3,
                                 socket_connect_timeout=3)
            self.sampler.redis.append((t, int(client.info("memory")["used_memory"])))
            client.close()
        except redis.RedisError:
            pass

    # -- the run ------------------------------------------------------------------------------------------
    def run(self) -> int:
        run = self.setup()
        jsonl = run.run_dir / "learner" / "faults.jsonl"
        died = None
        try:
            died = self._loop(run, jsonl)
        finally:
            self.end_windows(all_of_them=True)
        if died is None:
            died = self._settle(run, jsonl)
        run.stop()
        self.sample_final(run)
        figures, table = run.audit()
        print(table, flush=True)
        return self.report(run, figures, died)

    def _loop(self, run: FaultRun, jsonl: Path) -> str | None:
        next_sample = 0.0
        next_fault: float | None = None
        while self.chaos_t0 is None or time.time() - self.chaos_t0 < self.s.duration_s:
            if run.proc.poll() is not None:
                if self.bad_row_at is None:
                    return f"searchr1 up exited with {run.proc.returncode}"
                problem = self._restart_after_bad_row(run)
                if problem:
                    return problem
            self.sampler.poll_steps(jsonl)
            if next_fault is None and len(self.sampler.step_times) >= self.s.first_fault_after_steps:
                self.chaos_t0 = time.time()
                next_fault = time.time() + self._interval()
            if next_fault is not None and time.time() >= next_fault:
                self.inject(run)
                next_fault = time.time() + self._interval()
            self.end_windows()
            if time.time() >= next_sample:
                self.sample(run)
                next_sample = time.time() + self.s.sample_s
            time.sleep(0.5)
        return None

    def _restart_after_bad_row(self, run: FaultRun) -> str | None:
        """`up` stopped after the bad row went in: it must have stopped with exit 2 and the row named. The
        dataset is put back and `up` started again on the same run directory (it resumes)."""
        assert self.liveness is not None and self.bad_row_at is not None
        stopped, code = time.time(), run.proc.returncode
        said = run.output()[-20_000:]
        record = next(f for f in reversed(self.faults) if f["kind"] == "bad_row")
        record.update(stopped_after_s=stopped - self.bad_row_at, exit=code,
                      named="question: String should have at most 16384 characters" in said
                            and "a usage or configuration error" in said)
        self.bad_row_at = None
        if code != 2 or not record["named"]:
            return f"searchr1 up stopped with {code} after the bad dataset row, not 2 naming it"
        self.liveness.bad_row.restore()
        self.end_windows(all_of_them=True)
        (self.out / f"launcher-{int(stopped)}.out").write_text(run.output())
        run.start(env=self.env)
        self.password = None
        self.signals.stops.append((stopped - self.sampler.t0, time.time() - self.sampler.t0,
                                   "searchr1 up stopped: a dataset row refused (exit 2)"))
        print(f"soak: searchr1 up stopped with exit 2 naming the bad row after {record['stopped_after_s']:.0f} s; "
              "dataset restored, started again", flush=True)
        return None

    def _interval(self) -> float:
        return max(1.0, self.rng.uniform(self.s.fault_interval_s - self.s.fault_jitter_s,
                                         self.s.fault_interval_s + self.s.fault_jitter_s))

    def _settle(self, run: FaultRun, jsonl: Path) -> str | None:
        """After the faults: wait for one more step (the run recovered from the last one)."""
        before = len(self.sampler.step_times)
        deadline = time.time() + self.s.settle_s
        while time.time() < deadline:
            self.sampler.poll_steps(jsonl)
            if len(self.sampler.step_times) > before:
                return None
            if run.proc.poll() is not None:
                if self.bad_row_at is None:
                    return f"searchr1 up exited with {run.proc.returncode}"
                problem = self._restart_after_bad_row(run)
                if problem:
                    return problem
            time.sleep(0.5)
        return f"no step within {self.s.settle_s:.0f} s after the last fault"

    def sample_final(self, run: FaultRun) -> None:
        self.sampler.poll_steps(run.run_dir / "learner" / "faults.jsonl")
        self.sampler.disk.append((self.sampler.now(), disk_used(run.run_dir)))

    def report(self, run: FaultRun, audit: dict, died: str | None) -> int:
        """Write OUT/soak.json and OUT/soak.png, print the summary; 0 when the soak passed."""
        sm = self.sampler
        chaos_s = time.time() - self.chaos_t0 if self.chaos_t0 else 0.0
        signals = self.signals.intervals(run.run_dir / "restarts.jsonl", sm.t0, self.s.sample_s)
        result = soak_report.build(self.s, sm, self.faults, run, audit, died, network=self.netns_note,
                                   config=self.config_path, chaos_s=chaos_s, signals=signals)
        (self.out / "soak.json").write_text(json.dumps(result, indent=1))
        curves.plot(self.out / "soak.png", steps=sm.steps, faults=self.faults, redis=sm.redis, disk=sm.disk,
                    rss=sm.rss, title=f"soak: seed {self.s.seed}, {chaos_s / 60:.0f} min of faults, "
                                      f"{len(self.faults)} faults, {len(sm.step_times)} steps; {self.netns_note}")
        print(soak_report.summary_text(result), flush=True)
        return 0 if result["ok"] else 1

    def close(self) -> None:
        if self.hosts is not None:
            self.hosts.destroy()
        self.links.close()
        if self.liveness is not None:
            self.liveness.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("configs/soak.toml"))
    parser.add_argument("--duration-s", type=float, help="override [soak] duration_s")
    parser.add_argument("--seed", type=int, help="override [soak] seed")
    parser.add_argument("--out", type=Path, help="output directory (default runs/soak-SEED)")
    parser.add_argument("--markdown", type=Path, metavar="SOAK_JSON", help="print a report's tables and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        print(soak_report.markdown(json.loads(args.markdown.read_text())))
        return 0
    settings = SoakSettings.load(args.config if args.config.is_file() else None)
    if args.duration_s is not None:
        settings.duration_s = args.duration_s
    if args.seed is not None:
        settings.seed = args.seed
    out = (args.out or Path(f"runs/soak-{settings.seed}")).resolve()
    soak = Soak(settings, out, args.config)
    try:
        return soak.run()
    finally:
        soak.close()


if __name__ == "__main__":
    sys.exit(main())
