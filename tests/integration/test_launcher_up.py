"""`searchr1 up` end to end with stand-in services: real processes, real Redis, real gRPC/HTTP health.

The test writes a fake service script that answers to the launcher's real command templates (`serve
retriever …`, `serve reward …`, `serve rollout …`, `train …`, `index build …`): a gRPC health server
(searchr1.core.servers.GrpcServer) and HTTP `/healthz`, `/readyz` and `/metrics` (HttpServer), records its pid and
timings in FAKE_RECORD_DIR, and misbehaves on request (`--fake-*` flags appended through each process's
`extra_args`). The launcher runs in a subprocess as `python -m searchr1.launcher` (the `searchr1 up` command
on its own, so another service's half-finished CLI cannot break these tests).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.processes import pid_alive

FAKE_SERVICE = r'''
import argparse, asyncio, json, os, signal, subprocess, sys, time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("words", nargs="*")
for flag in ("--grpc-port", "--http-port", "--port", "--metrics-port"):
    p.add_argument(flag, type=int, default=0)
for flag in ("--out", "--redis", "--run", "--worker-id", "--corpus", "--config", "--index", "--host",
             "--kind", "--retriever", "--reward", "--fake-jsonl"):
    p.add_argument(flag, default="")
p.add_argument("--fake-health-delay", type=float, default=0.0)
p.add_argument("--fake-exit-after", type=float, default=-1.0)
p.add_argument("--fake-exit-code", type=int, default=0)
p.add_argument("--fake-ignore-sigterm", action="store_true")
p.add_argument("--fake-child", action="store_true")
p.add_argument("--fake-redis", action="store_true")
a = p.parse_args()
a.run = a.run or os.environ.get("LEARNER_REDIS__RUN", "")  # the learner's run comes by environment
words = a.words
# the learner gets its log dir through LearnerSettings' env prefix (specs.DEFAULT_ENV)
if words[0] == "train" and os.environ.get("LEARNER_LOG_DIR") and not a.fake_jsonl:
    Path(os.environ["LEARNER_LOG_DIR"]).mkdir(parents=True, exist_ok=True)
    a.fake_jsonl = str(Path(os.environ["LEARNER_LOG_DIR"]) / f"{a.run}.jsonl")
name = {"retriever": "retriever", "reward": "reward", "rollout": a.worker_id}.get(words[-1], None) \
    if words[0] == "serve" else ("learner" if words[0] == "train" else "index-build")
record_dir = Path(os.environ["FAKE_RECORD_DIR"])
record = {"name": name, "pid": os.getpid(), "argv": sys.argv[1:], "started_at": time.time(),
          "env": {k: v for k, v in os.environ.items() if k.endswith(("_TOKEN", "_REDIS__URL"))}}
a.redis = a.redis or os.environ.get("LEARNER_REDIS__URL") or os.environ.get("ROLLOUT_REDIS__URL", "")

def save():
    tmp = record_dir / f".{name}.json"
    tmp.write_text(json.dumps(record))
    tmp.replace(record_dir / f"{name}.json")

save()
print(f"hello from {name}", flush=True)
print(f"(EngineCore pid=1) INFO 11-24 04:52:48 [core.py:133] noise from {name}", file=sys.stderr, flush=True)
print(f"2026-11-24 04:52:48,000 WARNING searchr1.fake: warning from {name}", file=sys.stderr, flush=True)

if name == "index-build":
    Path(a.out).mkdir(parents=True)
    (Path(a.out) / "built-from").write_text(a.corpus)
    sys.exit(a.fake_exit_code)

if a.fake_child:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    record["child_pid"] = child.pid
    save()
if a.fake_ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

step = {"n": 0, "ready": False}

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    ready = step["ready"]
    status, body = 404, b"not found"
    if scope["path"] in ("/healthz", "/readyz"):
        status, body = (200, b"ok") if ready else (503, b"starting")
    elif scope["path"] == "/metrics":
        status = 200 if ready else 503
        body = (f"# TYPE searchr1_learner_steps_total counter\nsearchr1_learner_steps_total {step['n']}\n"
                f"# TYPE searchr1_learner_em_mean gauge\nsearchr1_learner_em_mean 0.25\n").encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})

async def main():
    from searchr1.core.servers import GrpcServer, HttpServer, install_shutdown_signals
    stop = asyncio.Event()
    if not a.fake_ignore_sigterm:
        install_shutdown_signals(stop)
    servers = []
    port = a.http_port or a.port or a.metrics_port
    h = HttpServer(app, "127.0.0.1", port)
    await h.start()  # listening at once, but /healthz and /metrics answer 503 until ready
    servers.append(h)
    if a.fake_health_delay:
        try:
            await asyncio.wait_for(stop.wait(), a.fake_health_delay)
        except asyncio.TimeoutError:
            pass
    if name == "retriever":  # gRPC health comes up late too
        g = GrpcServer("127.0.0.1", a.grpc_port)
        await g.start()
        servers.append(g)
    record["healthy_at"] = time.time()
    save()
    step["ready"] = True
    print(f"{name} serving on {port}", flush=True)
    if a.fake_redis:
        from searchr1.core.schemas import WeightVersion
        from searchr1.streams import StreamKeys, connect
        from searchr1.weightsync import announce
        r = connect(a.redis)
        keys = StreamKeys(a.run)
        await r.delete(keys.tasks)
        await r.xgroup_create(keys.tasks, "rollout", id="0", mkstream=True)
        for i in range(3):
            await r.xadd(keys.tasks, {b"m": b"x"})
        await announce(r, keys, WeightVersion(version=7, uri="/tmp/w", sha256="0" * 64))
        record["redis_ok"] = bool(await r.ping())
        save()
        await r.aclose()
    t0 = time.monotonic()
    while not stop.is_set():
        if a.fake_jsonl:
            step["n"] += 1
            with open(a.fake_jsonl, "a") as f:
                f.write(json.dumps({"step": step["n"], "reward_mean": 0.5, "searches_per_trajectory": 1.5}) + "\n")
        if a.fake_exit_after >= 0 and time.monotonic() - t0 >= a.fake_exit_after:
            print(f"{name} exiting with {a.fake_exit_code}", flush=True)
            os._exit(a.fake_exit_code)
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass
    print(f"{name} got SIGTERM, shutting down", flush=True)
    record["stopped_at"] = time.time()
    save()
    for s in reversed(servers):
        await s.stop() if isinstance(s, HttpServer) else await s.stop(0.1)

asyncio.run(main())
'''


def _toml_list(items: list[str]) -> str:
    return json.dumps(items)


def write_config(tmp_path: Path, *, workers: int = 1, retriever: list[str] = (), reward: list[str] = (),
                 rollout: list[str] = (), learner: list[str] = (), extra: str = "", corpus: str | None = None,
                 index_exists: bool = True, grace: float = 3.0, learner_table: str = "") -> Path:
    fake = tmp_path / "fake_service.py"
    fake.write_text(FAKE_SERVICE)
    index = tmp_path / "index"
    if index_exists:
        index.mkdir(exist_ok=True)
    corpus_line = f'corpus = "{corpus}"' if corpus else ""
    cfg = tmp_path / "run.toml"
    cfg.write_text(textwrap.dedent(f"""
        [launcher]
        run = "t"
        command = {_toml_list([sys.executable, str(fake)])}
        grace_period_s = {grace}
        log_tail_lines = 5
        {extra}

        [launcher.retriever]
        index_dir = "{index}"
        {corpus_line}
        health_timeout_s = 30
        extra_args = {_toml_list(list(retriever))}

        [launcher.reward]
        health_timeout_s = 30
        extra_args = {_toml_list(list(reward))}

        [launcher.rollout]
        workers = {workers}
        health_timeout_s = 30
        extra_args = {_toml_list(list(rollout))}

        [launcher.learner]
        health_timeout_s = 30
        {learner_table}
        extra_args = {_toml_list(list(learner))}

        [launcher.status]
        refresh_s = 0.2
        plain_interval_s = 0.3

        [retriever]
        [reward]
        """))
    return cfg


def launch(tmp_path: Path, cfg: Path, *extra_env: tuple[str, str], flags: tuple[str, ...] = ()
           ) -> tuple[subprocess.Popen, Path, Path]:
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    run_dir = tmp_path / "run"
    env = {**os.environ, "FAKE_RECORD_DIR": str(records), "PYTHONUNBUFFERED": "1", **dict(extra_env)}
    env.pop("LAUNCHER_RUN_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchr1.launcher", "--config", str(cfg), "--run-dir", str(run_dir), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
    )
    return proc, records, run_dir


def finish(proc: subprocess.Popen, timeout: float = 90.0) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL) if False else proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"launcher did not finish within {timeout}s:\n{out}")
    return proc.returncode, out


def records_of(records: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in records.glob("*.json") if not p.name.startswith(".")}


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def all_pids(recs: dict[str, dict]) -> list[int]:
    pids = []
    for r in recs.values():
        pids.append(r["pid"])
        if "child_pid" in r:
            pids.append(r["child_pid"])
    return pids


def test_learner_exit_ends_the_run_with_its_code_in_dependency_order(tmp_path):
    cfg = write_config(
        tmp_path, workers=2,
        retriever=["--fake-health-delay", "1.0", "--fake-child"],
        learner=["--fake-exit-after", "1.0", "--fake-exit-code", "3", "--fake-redis"],
        extra='restart = { policy = "never" }',
    )
    proc, records, run_dir = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 3, out
    recs = records_of(records)
    assert set(recs) == {"retriever", "reward", "rollout-0", "rollout-1", "learner"}, out
    # health gating: the reward service started only after the (late) retriever was healthy, …
    assert recs["reward"]["started_at"] >= recs["retriever"]["healthy_at"]
    assert recs["retriever"]["healthy_at"] - recs["retriever"]["started_at"] >= 1.0
    for w in ("rollout-0", "rollout-1"):
        assert recs[w]["started_at"] >= recs["reward"]["healthy_at"]
        assert recs["learner"]["started_at"] >= recs[w]["healthy_at"]
    # … the real command templates reached the processes …
    assert recs["rollout-1"]["argv"][:2] == ["serve", "rollout"]
    assert "--worker-id" in recs["rollout-1"]["argv"] and "rollout-1" in recs["rollout-1"]["argv"]
    assert recs["learner"]["argv"][0] == "train" and "--config" in recs["learner"]["argv"]
    assert (run_dir / "learner" / "t.jsonl").is_file()  # LEARNER_LOG_DIR / {run}.jsonl
    # … Redis was started by the launcher and reachable by the learner …
    assert recs["learner"]["redis_ok"] is True
    redis_url = recs["learner"]["env"]["LEARNER_REDIS__URL"]
    assert redis_url.startswith("redis://:") and "@127.0.0.1:" in redis_url
    # … with the secrets (Redis's generated password, the run's generated token) in the environment of the
    # processes that need them and in no argv: neither the services' nor Redis's (processes.json)
    password, token = urlsplit(redis_url).password, recs["retriever"]["env"]["RETRIEVER_TOKEN"]
    assert password and len(password) >= 16 and token and len(token) >= 16
    assert recs["reward"]["env"]["REWARD_TOKEN"] == token == recs["learner"]["env"]["LEARNER_WEIGHTS__TOKEN"]
    assert all(recs[w]["env"][f"ROLLOUT_{k}__TOKEN"] == token
               for w in ("rollout-0", "rollout-1") for k in ("RETRIEVER", "REWARD", "WEIGHTS"))
    assert recs["rollout-1"]["env"]["ROLLOUT_REDIS__URL"] == redis_url
    argvs = [r["argv"] for r in recs.values()] + [r["argv"] for r in json.loads(
        (run_dir / "processes.json").read_text()).values()]
    assert not [a for a in argvs if password in " ".join(a) or token in " ".join(a)], argvs
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert password not in out + logs and token not in out + logs
    # … everything else was stopped with SIGTERM, in reverse order, and nothing is left behind
    for name in ("retriever", "reward", "rollout-0", "rollout-1"):
        assert "stopped_at" in recs[name], (name, out)
    assert recs["reward"]["stopped_at"] <= recs["retriever"]["stopped_at"]
    assert recs["rollout-0"]["stopped_at"] <= recs["reward"]["stopped_at"]
    assert not [p for p in all_pids(recs) if pid_alive(p)]
    table = json.loads((run_dir / "processes.json").read_text())
    assert not pid_alive(table["redis"]["pid"])
    assert "learner exited with code 3" in out
    # status line (plain, not a TTY): numbers from the JSONL, /metrics and Redis; weight version from Redis
    status = [line for line in out.splitlines() if "status: step" in line]
    assert status, out
    assert any("weights v7" in line and "tasks 3+0" in line for line in status), status
    assert any("EM 0.250" in line and "reward 0.500" in line and "searches/q 1.50" in line
               for line in status), status


@pytest.mark.parametrize("verbose", [False, True])
def test_logs_are_prefixed_and_written_per_process(tmp_path, verbose):
    cfg = write_config(tmp_path, workers=1, learner=["--fake-exit-after", "0.2"])
    proc, _records, run_dir = launch(tmp_path, cfg, flags=("--verbose",) if verbose else ())
    code, out = finish(proc)
    assert code == 0, out
    lines = out.splitlines()
    assert ("(--verbose streams them here)" in out) != verbose, out
    for name in ("retriever", "reward", "rollout-0", "learner"):
        # the console: our warnings always, everything else only with --verbose
        assert any(f"{name} │ " in line and f"searchr1.fake: warning from {name}" in line for line in lines), name
        assert any(line.strip().startswith(f"{name} │ hello from {name}") for line in lines) == verbose, out
        assert any(f"noise from {name}" in line for line in lines) == verbose, out
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert f"hello from {name}" in log and f"warning from {name}" in log and f"noise from {name}" in log
        assert "│" not in log  # files hold the process's own lines, unprefixed
    assert "PONG" not in (run_dir / "logs" / "redis.log").read_text() or True
    assert (run_dir / "logs" / "redis.log").exists()


def test_unexpected_death_stops_all_and_names_it(tmp_path):
    cfg = write_config(tmp_path, workers=2, rollout=[], learner=[],
                       reward=["--fake-child"],
                       extra='restart = { policy = "never" }')
    # rollout-1 dies a moment after becoming healthy (extra_args apply to every worker: use a per-worker
    # template override instead, so only one dies)
    text = cfg.read_text().replace(
        "[launcher.retriever]",
        'templates.rollout = ["serve", "rollout", "--worker-id", "{worker_id}", "--metrics-port", '
        '"{metrics_port}", "--fake-exit-after", "{worker_index}", "--fake-exit-code", "5"]\n\n'
        "[launcher.retriever]")
    cfg.write_text(text)
    proc, records, _run_dir = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code != 0, out
    recs = records_of(records)
    # rollout-0 exits at once (worker_index 0), rollout-1 a second after; on a loaded machine rollout-0 may
    # still be starting when rollout-1 goes: either way the first death is named, with its log tail
    dead = "rollout-0" if "rollout-0 exited unexpectedly" in out else "rollout-1"
    assert f"{dead} exited unexpectedly with code 5" in out, out
    assert f"{dead} exiting with 5" in out.split(f"{dead} exited unexpectedly")[1]
    assert not [p for p in all_pids(recs) if pid_alive(p)]
    assert "stopped_at" in recs["reward"] and "stopped_at" in recs["retriever"]


def test_crashed_service_is_restarted_with_backoff_and_the_run_goes_on(tmp_path):
    cfg = write_config(tmp_path, workers=1, rollout=["--fake-child"], learner=["--fake-redis"],
                       extra='restart = { backoff_initial_s = 0.5, jitter_s = 0.0 }')
    proc, records, run_dir = launch(tmp_path, cfg)
    try:
        first = wait_for(lambda: records_of(records).get("learner", {}).get("healthy_at")
                         and records_of(records)["rollout-0"], what="all up")
        time.sleep(2.0)  # the launcher's gate polls every 0.2 s: let it see the learner healthy (run up)
        os.kill(first["pid"], signal.SIGKILL)  # the worker; its child is left in its process group
        wait_for(lambda: records_of(records)["rollout-0"]["pid"] != first["pid"]
                 and "healthy_at" in records_of(records)["rollout-0"], what="rollout-0 restarted")
        second = records_of(records)["rollout-0"]
        assert not pid_alive(first["child_pid"])  # the dead worker's group was cleared before the restart
        assert second["started_at"] - first["started_at"] >= 0.5
        wait_for(lambda: (run_dir / "restarts.jsonl").is_file(), what="the restart record")
        record = json.loads((run_dir / "restarts.jsonl").read_text().splitlines()[0])
        assert record["name"] == "rollout-0" and record["exit"] == 128 + signal.SIGKILL
        assert record["attempt"] == 1 and record["backoff_s"] == 0.5
        assert record["healthy_at"] > record["died_at"]
        assert json.loads((run_dir / "processes.json").read_text())["rollout-0"]["restarts"] == 1
        # Redis too: restarted on the same port with its append-only file, the learner's entries still there
        table = json.loads((run_dir / "processes.json").read_text())
        os.kill(table["redis"]["pid"], signal.SIGKILL)
        wait_for(lambda: json.loads((run_dir / "processes.json").read_text())["redis"]["restarts"] == 1
                 and len((run_dir / "restarts.jsonl").read_text().splitlines()) == 2, what="redis restarted")
        import redis as redis_py
        url = records_of(records)["learner"]["env"]["LEARNER_REDIS__URL"]
        client = redis_py.Redis.from_url(url)
        assert client.xlen("searchr1:t:tasks") == 3  # written by the learner stand-in before the kill
        client.close()
        # the restarted Redis still requires the run's password (given on its stdin again)
        anonymous = redis_py.Redis.from_url(url.replace(f":{urlsplit(url).password}@", ""))
        with pytest.raises(redis_py.AuthenticationError):
            anonymous.xlen("searchr1:t:tasks")
        anonymous.close()
    finally:
        proc.send_signal(signal.SIGINT)
        code, out = finish(proc)
    assert code == 130, out
    assert "restarting rollout-0 (exit 137, attempt 1, backoff 0.5s)" in out, out
    assert "restarting redis (exit 137, attempt 1" in out, out
    assert "restarts: rollout-0 1, redis 1" in out or "restarts: redis 1, rollout-0 1" in out, out
    assert not [p for p in all_pids(records_of(records)) if pid_alive(p)]


def test_restarts_beyond_the_budget_end_the_run(tmp_path):
    cfg = write_config(tmp_path, workers=1, learner=["--fake-exit-after", "0.5", "--fake-exit-code", "4"],
                       extra='restart = { max_restarts = 2, backoff_initial_s = 0.1, jitter_s = 0.0 }')
    proc, _records, run_dir = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 4, out  # the main process's code, once it is given up
    assert "restarting learner (exit 4, attempt 1, backoff 0.1s)" in out, out
    assert "restarting learner (exit 4, attempt 2, backoff 0.2s)" in out, out
    assert "learner exited with code 4 after 2 restart(s) within 600s; giving up" in out, out
    assert len((run_dir / "restarts.jsonl").read_text().splitlines()) == 2


def test_a_learner_exiting_2_is_not_restarted(tmp_path):
    # exit 2 is a usage or configuration error (a dataset row the wire refuses): a restart meets it again
    cfg = write_config(tmp_path, workers=1, learner=["--fake-exit-after", "0.5", "--fake-exit-code", "2"],
                       extra='restart = { max_restarts = 5, backoff_initial_s = 0.1, jitter_s = 0.0 }')
    proc, records, run_dir = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 2, out
    assert "restarting learner" not in out, out
    assert "learner exited with code 2, a usage or configuration error (its log says which): a restart " \
           "would meet it again; stopping everything" in out, out
    assert not (run_dir / "restarts.jsonl").exists()
    assert not [p for p in all_pids(records_of(records)) if pid_alive(p)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_everything_without_orphans(tmp_path, sig):
    cfg = write_config(tmp_path, workers=1, retriever=["--fake-child"], rollout=["--fake-child"],
                       learner=["--fake-child"])
    proc, records, run_dir = launch(tmp_path, cfg)
    wait_for(lambda: "healthy_at" in records_of(records).get("learner", {}), what="learner up")
    recs = records_of(records)
    table = json.loads((run_dir / "processes.json").read_text())
    pids = all_pids(recs) + [table["redis"]["pid"]]
    assert all(pid_alive(p) for p in pids)
    proc.send_signal(sig)
    code, out = finish(proc)
    assert code == 128 + sig, out
    assert not [p for p in pids if pid_alive(p)], out
    recs = records_of(records)
    assert all("stopped_at" in recs[n] for n in ("retriever", "reward", "rollout-0", "learner")), out


def test_stubborn_process_is_killed_after_the_grace_period(tmp_path):
    cfg = write_config(tmp_path, workers=0, reward=["--fake-ignore-sigterm", "--fake-child"],
                       learner=["--fake-exit-after", "0.1"], grace=1.0)
    proc, records, _run_dir = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 0, out
    assert "reward still running after 1s: SIGKILL" in out
    assert not [p for p in all_pids(records_of(records)) if pid_alive(p)]


def test_launcher_killed_hard_leaves_no_orphans(tmp_path):
    cfg = write_config(tmp_path, workers=1)
    proc, records, run_dir = launch(tmp_path, cfg)
    wait_for(lambda: "healthy_at" in records_of(records).get("learner", {}), what="learner up")
    table = json.loads((run_dir / "processes.json").read_text())
    pids = [r["pid"] for r in table.values()]
    proc.kill()
    proc.communicate()
    wait_for(lambda: not [p for p in pids if pid_alive(p)], timeout=15, what="children to die with the launcher")


def test_port_taken_is_refused_naming_port_and_process(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = write_config(tmp_path, extra="")
        cfg.write_text(cfg.read_text().replace("[launcher.reward]\n", f"[launcher.reward]\nport = {port}\n"))
        proc, records, _ = launch(tmp_path, cfg)
        code, out = finish(proc)
    assert code == 2, out
    assert f"port {port} (reward) is already in use" in out
    assert not records_of(records)  # nothing was started


def test_missing_redis_server_is_refused(tmp_path):
    cfg = write_config(tmp_path)
    proc, records, _ = launch(tmp_path, cfg, ("SEARCHR1_REDIS_SERVER", str(tmp_path / "no-such-redis")))
    code, out = finish(proc)
    assert code == 2, out
    assert "no-such-redis" in out and "redis" in out
    assert not records_of(records)


def test_missing_corpus_is_refused_and_present_corpus_builds_the_index(tmp_path):
    cfg = write_config(tmp_path, index_exists=False, corpus=str(tmp_path / "corpus.jsonl"))
    proc, records, _ = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 2, out
    assert "corpus.jsonl not found" in out and "index-build" in out
    assert not records_of(records)

    (tmp_path / "corpus.jsonl").write_text('{"id": "0", "contents": "\\"A\\"\\nb"}\n')
    cfg = write_config(tmp_path, index_exists=False, corpus=str(tmp_path / "corpus.jsonl"), workers=0,
                       learner=["--fake-exit-after", "0.1"])
    proc, records, _ = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 0, out
    recs = records_of(records)
    assert recs["retriever"]["started_at"] >= recs["index-build"]["started_at"]
    assert (tmp_path / "index" / "built-from").read_text() == str(tmp_path / "corpus.jsonl")
    assert "index-build done" in out


def test_health_timeout_fails_with_last_check(tmp_path):
    # 8 s: long enough for the fake service's interpreter to start and answer 503 on a loaded machine,
    # so the last check the message carries is the service's own answer, not a refused connection
    cfg = write_config(tmp_path, reward=["--fake-health-delay", "60"])
    cfg.write_text(cfg.read_text().replace("[launcher.reward]\nhealth_timeout_s = 30",
                                           "[launcher.reward]\nhealth_timeout_s = 8"))
    proc, records, _ = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 1, out
    assert "reward did not become healthy within 8s" in out and "HTTP 503" in out, out
    recs = records_of(records)
    assert "rollout-0" not in recs  # the next stage never started
    assert not [p for p in all_pids(recs) if pid_alive(p)]


def test_external_redis_is_used_and_checked(tmp_path, redis_server):
    cfg = write_config(tmp_path, workers=0, learner=["--fake-exit-after", "0.1", "--fake-redis"],
                       extra=f'redis.url = "{redis_server.url}"')
    proc, records, run_dir = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 0, out
    assert "redis" not in json.loads((run_dir / "processes.json").read_text())  # none started
    learner = records_of(records)["learner"]
    assert learner["redis_ok"] is True and learner["env"]["LEARNER_REDIS__URL"] == redis_server.url
    assert "--redis" not in learner["argv"]

    from searchr1.core.servers import free_port

    dead = f"redis://127.0.0.1:{free_port()}/0"
    cfg = write_config(tmp_path, workers=0, extra=f'redis.url = "{dead}"')
    proc, _records, _ = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 2, out
    assert f"refusing to start: PING {dead} failed" in out


def test_signal_during_start_up_stops_what_was_started(tmp_path):
    cfg = write_config(tmp_path, retriever=["--fake-health-delay", "60", "--fake-child"])
    proc, records, run_dir = launch(tmp_path, cfg)
    wait_for(lambda: "child_pid" in records_of(records).get("retriever", {}), what="retriever started")
    pids = all_pids(records_of(records)) + [json.loads((run_dir / "processes.json").read_text())["redis"]["pid"]]
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc)
    assert code == 130, out
    assert set(records_of(records)) == {"retriever"}  # the reward service never started
    assert not [p for p in pids if pid_alive(p)]


def test_failed_index_build_stops_the_run(tmp_path):
    (tmp_path / "corpus.jsonl").write_text("{}\n")
    cfg = write_config(tmp_path, index_exists=False, corpus=str(tmp_path / "corpus.jsonl"),
                       extra='templates.index-build = ["index", "build", "--out", "{index_dir}", '
                             '"--fake-exit-code", "4"]')
    proc, records, _ = launch(tmp_path, cfg)
    code, out = finish(proc)
    assert code == 1, out
    assert "index-build failed with code 4" in out
    assert "hello from index-build" in out.split("index-build failed with code 4")[1]  # its log's tail
    assert set(records_of(records)) == {"index-build"}
