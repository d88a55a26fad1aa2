"""The launch plan: dependency order, the exact command lines, port resolution and refusals, settings."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from searchr1.core.settings import ConfigError, load_settings
from searchr1.launcher.health import GrpcHealthGate, HttpGate, RedisPingGate
from searchr1.launcher.planner import build_plan
from searchr1.launcher.settings import LauncherSettings
from searchr1.launcher.specs import DEFAULT_TEMPLATES, dry_run_lines, render_template

REPO = Path(__file__).resolve().parents[2]


def _settings(**kw) -> LauncherSettings:
    return LauncherSettings(**kw)


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text("[launcher]\n")
    (tmp_path / "index").mkdir()
    return path


def test_order_commands_and_gates(tmp_path, cfg):
    s = _settings(run="r1", command=["searchr1"], retriever={"index_dir": str(tmp_path / "index")},
                  rollout={"workers": 2}, redis={"port": 0})
    plan = build_plan(s, cfg, tmp_path / "run")
    assert plan.problems == []
    assert [p.name for p in plan.specs] == ["redis", "retriever", "reward", "rollout-0", "rollout-1", "learner"]
    assert [p.stage for p in plan.specs] == ["redis", "retriever", "reward", "rollout", "rollout", "learner"]
    redis, retriever, reward, r0, r1, learner = plan.specs
    assert redis.argv[1:4] == ["-", "--port", plan.redis_url.rsplit(":", 1)[1].split("/")[0]]
    password = urlsplit(plan.redis_url).password
    assert plan.redis_url == f"redis://:{password}@127.0.0.1:{_flag(redis.argv, '--port')}/0" and len(password) == 32
    assert redis.stdin == f"requirepass {password}\n".encode()  # the password: on stdin, not in argv
    gport, hport = _flag(retriever.argv, "--grpc-port"), _flag(retriever.argv, "--http-port")
    assert retriever.argv == ["searchr1", "serve", "retriever", "--index", str(tmp_path / "index"),
                              "--host", "127.0.0.1", "--grpc-port", gport, "--http-port", hport,
                              "--config", str(cfg.resolve())]
    rport = _flag(reward.argv, "--port")
    assert reward.argv == ["searchr1", "serve", "reward", "--host", "127.0.0.1", "--port", rport,
                           "--config", str(cfg.resolve())]
    m1 = _flag(r1.argv, "--metrics-port")
    assert r1.argv == ["searchr1", "serve", "rollout", "--config", str(cfg.resolve()), "--worker-id", "rollout-1",
                       "--run", "r1", "--retriever", f"127.0.0.1:{gport}",
                       "--reward", f"http://127.0.0.1:{rport}", "--metrics-port", m1]
    lport = _flag(learner.argv, "--metrics-port")
    assert learner.argv == ["searchr1", "train", "--config", str(cfg.resolve()), "--metrics-port", lport]
    token = retriever.env["RETRIEVER_TOKEN"]
    assert len(token) >= 32
    assert learner.env == {"LEARNER_REDIS__URL": plan.redis_url, "LEARNER_WEIGHTS__TOKEN": token,
                           "LEARNER_REDIS__RUN": "r1",
                           "LEARNER_LOG_DIR": f"{tmp_path / 'run'}/learner",
                           "LEARNER_WEIGHTS__DIR": f"{tmp_path / 'run'}/weights",
                           "LEARNER_CHECKPOINT__DIR": f"{tmp_path / 'run'}/checkpoints",
                           "LEARNER_ARCHIVE__DIR": f"{tmp_path / 'run'}/archive",
                           "LEARNER_WEIGHTS__BROADCAST__RECEIVERS": "2"}
    assert plan.metrics_jsonl == tmp_path / "run" / "learner" / "r1.jsonl"
    assert retriever.env == {"RETRIEVER_TOKEN": token} and reward.env == {"REWARD_TOKEN": token}
    assert r1.env == {"ROLLOUT_WEIGHTS__DOWNLOAD_DIR": f"{tmp_path / 'run'}/rollout-weights/rollout-1",
                      "ROLLOUT_REDIS__URL": plan.redis_url, "ROLLOUT_RETRIEVER__TOKEN": token,
                      "ROLLOUT_REWARD__TOKEN": token, "ROLLOUT_WEIGHTS__TOKEN": token}
    # no process's argv (Redis's included) carries a secret; --dry-run's text hides them
    assert not [s.name for s in plan.specs if password in " ".join(s.argv) or token in " ".join(s.argv)]
    dry = "\n".join(dry_run_lines(plan))
    assert password not in dry and token not in dry and "RETRIEVER_TOKEN=***" in dry
    assert build_plan(s, cfg, tmp_path / "run").values["token"] != token  # one per run
    assert learner.main and not any(p.main for p in plan.specs[:-1])
    # every 0-port resolved to a distinct real port
    ports = [int(p) for p in (gport, hport, rport, _flag(r0.argv, "--metrics-port"), m1, lport,
                              _flag(redis.argv, "--port"))]
    assert len(set(ports)) == len(ports) and all(p > 0 for p in ports)
    # gates: gRPC health AND HTTP /healthz for the retriever, /healthz, /metrics, PING for the others
    assert retriever.gates == [GrpcHealthGate(f"127.0.0.1:{gport}"), HttpGate(f"http://127.0.0.1:{hport}/healthz")]
    assert reward.gates == [HttpGate(f"http://127.0.0.1:{rport}/healthz")]
    assert r1.gates == [HttpGate(f"http://127.0.0.1:{m1}/readyz")]
    assert learner.gates == [HttpGate(f"http://127.0.0.1:{lport}/readyz")]
    assert redis.gates == [RedisPingGate(plan.redis_url)]
    assert plan.learner_metrics_url == f"http://127.0.0.1:{lport}/metrics"


def test_default_command_is_this_interpreter(cfg, tmp_path):
    plan = build_plan(_settings(retriever={"index_dir": str(tmp_path / "index")}), cfg, tmp_path / "run")
    assert plan.specs[1].argv[:3] == [sys.executable, "-m", "searchr1.cli"]


def test_fixed_ports_are_used_and_consecutive_for_workers(cfg, tmp_path):
    base = _free_block(3)
    s = _settings(command=["x"], retriever={"index_dir": str(tmp_path / "index")},
                  rollout={"workers": 3, "metrics_port": base})
    plan = build_plan(s, cfg, tmp_path / "run")
    assert plan.problems == []
    assert [_flag(p.argv, "--metrics-port") for p in plan.specs if p.stage == "rollout"] == [
        str(base), str(base + 1), str(base + 2)]


def _free_block(n: int) -> int:
    for start in range(40000, 60000, 17):
        if all(_free(start + i) for i in range(n)):
            return start
    raise RuntimeError("no free block")


def _free(port: int) -> bool:
    from searchr1.core.servers import port_is_free

    return port_is_free("127.0.0.1", port)


def test_taken_port_is_a_problem_naming_port_and_process(cfg, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        plan = build_plan(_settings(command=["x"], retriever={"index_dir": str(tmp_path / "index")},
                                    learner={"metrics_port": port}), cfg, tmp_path / "run")
    assert len(plan.problems) == 1
    assert f"port {port} (learner metrics) is already in use" in plan.problems[0]


def test_same_port_twice_is_a_problem(cfg, tmp_path):
    port = _free_block(1)
    plan = build_plan(_settings(command=["x"], retriever={"index_dir": str(tmp_path / "index"), "http_port": port},
                                reward={"port": port}), cfg, tmp_path / "run")
    assert plan.problems == [f"port {port} is configured for both retriever HTTP and reward"]


def test_external_redis_starts_none(cfg, tmp_path):
    plan = build_plan(_settings(command=["x"], retriever={"index_dir": str(tmp_path / "index")},
                                redis={"url": "redis://10.0.0.1:6380/2"}), cfg, tmp_path / "run")
    assert plan.specs[0].name == "retriever"
    assert plan.redis_url == "redis://10.0.0.1:6380/2"
    assert plan.specs[-1].env["LEARNER_REDIS__URL"] == "redis://10.0.0.1:6380/2"
    assert "--redis" not in plan.specs[-1].argv


def test_missing_redis_server_is_a_problem(cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("SEARCHR1_REDIS_SERVER", str(tmp_path / "nope"))
    plan = build_plan(_settings(command=["x"], retriever={"index_dir": str(tmp_path / "index")}), cfg, tmp_path)
    assert len(plan.problems) == 1 and plan.problems[0].startswith("redis: ") and "nope" in plan.problems[0]


def test_missing_index_is_built_first(cfg, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("{}\n")
    s = _settings(command=["x"], retriever={"index_dir": str(tmp_path / "new-index"), "corpus": str(corpus),
                                            "kind": "flat"})
    plan = build_plan(s, cfg, tmp_path / "run")
    assert plan.problems == []
    build = plan.specs[1]
    assert build.name == "index-build" and build.oneshot and not build.gates
    assert build.argv == ["x", "index", "build", "--corpus", str(corpus), "--kind", "flat",
                          "--out", str(tmp_path / "new-index")]
    assert plan.specs[2].name == "retriever"


def test_missing_index_without_corpus_is_a_problem(cfg, tmp_path):
    plan = build_plan(_settings(command=["x"]), cfg, tmp_path / "run")  # default index: RUN_DIR/index
    assert len(plan.problems) == 1 and "no corpus is configured" in plan.problems[0]
    assert str(tmp_path / "run" / "index") in plan.problems[0]
    plan = build_plan(_settings(command=["x"], retriever={"corpus": str(tmp_path / "gone.jsonl")}), cfg,
                      tmp_path / "run")
    assert plan.problems == [(f"index-build: corpus {tmp_path / 'gone.jsonl'} not found (needed to build the "
                             f"missing index {tmp_path / 'run' / 'index'})")]


def test_missing_config_is_a_problem(tmp_path):
    (tmp_path / "index").mkdir()
    plan = build_plan(_settings(command=["x"], retriever={"index_dir": str(tmp_path / "index")}),
                      tmp_path / "nope.toml", tmp_path / "run")
    assert plan.problems == [f"run config not found: {tmp_path / 'nope.toml'}"]


def test_template_and_command_overrides(cfg, tmp_path):
    s = _settings(command=["searchr1"], retriever={"index_dir": str(tmp_path / "index")},
                  templates={"learner": ["train", "--config", "{config}", "--log-dir", "{run_dir}/learner"]},
                  commands={"learner": ["torchrun", "--nproc-per-node", "2", "-m", "searchr1.cli"]},
                  learner={"extra_args": ["--seed", "3"], "env": {"LEARNER_LOG_DIR": "{run_dir}/x", "A": "b"}})
    plan = build_plan(s, cfg, tmp_path / "run")
    assert plan.specs[-1].argv == ["torchrun", "--nproc-per-node", "2", "-m", "searchr1.cli", "train", "--config",
                                   str(cfg.resolve()), "--log-dir", f"{tmp_path / 'run'}/learner", "--seed", "3"]
    assert plan.specs[-2].argv[0] == "searchr1"
    assert plan.specs[-1].env["LEARNER_LOG_DIR"] == f"{tmp_path / 'run'}/x" and plan.specs[-1].env["A"] == "b"


def test_bad_templates_are_config_errors(cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown placeholder \{nope\}"):
        build_plan(_settings(command=["x"], retriever={"index_dir": str(tmp_path / "index")},
                             templates={"reward": ["serve", "{nope}"]}), cfg, tmp_path)
    with pytest.raises(ConfigError, match="unknown process"):
        build_plan(_settings(templates={"rewards": ["x"]}), cfg, tmp_path)
    with pytest.raises(ConfigError, match="unknown process"):
        build_plan(_settings(commands={"lerner": ["x"]}), cfg, tmp_path)
    with pytest.raises(ConfigError, match=r"learner env.*\{nope\}"):
        build_plan(_settings(command=["x"], retriever={"index_dir": str(tmp_path / "index")},
                             learner={"env": {"X": "{nope}"}}), cfg, tmp_path)


def test_render_template():
    assert render_template("t", ["--a", "{x}", "{x}:{y}", "plain"], {"x": "1", "y": "b"}) == [
        "--a", "1", "1:b", "plain"]
    assert set(DEFAULT_TEMPLATES) == {"index-build", "retriever", "reward", "rollout", "learner", "eval"}


def test_metrics_jsonl_placeholders(cfg, tmp_path):
    plan = build_plan(_settings(run="abc", command=["x"], retriever={"index_dir": str(tmp_path / "index")}),
                      cfg, tmp_path / "run")
    assert plan.metrics_jsonl == tmp_path / "run" / "learner" / "abc.jsonl"
    plan = build_plan(_settings(run="abc", command=["x"], retriever={"index_dir": str(tmp_path / "index")},
                                learner={"metrics_jsonl": "logs/{run}.jsonl"}), cfg, tmp_path / "run")
    assert plan.metrics_jsonl == (Path.cwd() / "logs" / "abc.jsonl").resolve()


def test_settings_from_toml_and_env(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text('[launcher]\nrun = "t"\n[launcher.rollout]\nworkers = 3\n[launcher.reward]\nport = 9100\n'
                    "[learner]\nwhatever = 1\n")
    monkeypatch.setenv("LAUNCHER_ROLLOUT__WORKERS", "5")
    s = load_settings(LauncherSettings, path)
    assert (s.run, s.rollout.workers, s.reward.port) == ("t", 5, 9100)
    path.write_text("[launcher]\nworkerz = 3\n")
    with pytest.raises(ValueError, match="workerz"):
        load_settings(LauncherSettings, path)


def test_tiny_cpu_config_loads():
    cfg = REPO / "configs" / "tiny-cpu.toml"
    s = load_settings(LauncherSettings, cfg)
    assert s.rollout.workers >= 1 and s.retriever.corpus
    plan = build_plan(s, cfg)
    names = [p.name for p in plan.specs]
    assert names[-1] == "learner" and names.index("retriever") < names.index("reward") < names.index("rollout-0")


def test_redis_password_placeholder_routes_a_client_through_a_proxy(tmp_path, cfg):
    """`{redis_password}` lets a process's env name a Redis URL of its own (a proxy per worker, as the soak
    does) with the password of the Redis `up` starts; it reaches the env, never the argv."""
    url = "redis://:{redis_password}@127.0.0.1:4{worker_index}0/0"
    s = _settings(run="r1", command=["searchr1"], retriever={"index_dir": str(tmp_path / "index")},
                  rollout={"workers": 2, "env": {"ROLLOUT_REDIS__URL": url}})
    plan = build_plan(s, cfg, tmp_path / "run")
    password = urlsplit(plan.redis_url).password
    r0, r1 = (p for p in plan.specs if p.stage == "rollout")
    assert r0.env["ROLLOUT_REDIS__URL"] == f"redis://:{password}@127.0.0.1:400/0"
    assert r1.env["ROLLOUT_REDIS__URL"] == f"redis://:{password}@127.0.0.1:410/0"
    assert all(password not in " ".join(p.argv) for p in plan.specs)
