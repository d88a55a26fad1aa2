"""`build_plan(settings, config)`: `LauncherSettings` (and the run config's `[placement]`) turned into the
`LaunchPlan` of `searchr1 up` (`specs.py` holds the templates and the plan's types; the module docstring
there says what a plan holds).

The order is the dependency order: Redis → index build if the index is missing → retriever → reward →
rollout workers → learner. Ports configured as 0 are resolved here to free ones, so every process's
address is known before the first one starts; what is wrong (a port taken, `redis-server` not found, a
corpus missing, a service table its settings class refuses (`tables.py`), a `[launcher.*]` entry or a
service-table value that contradicts the placement) is collected in `plan.problems`.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from searchr1.core.redis_server import RedisNotFound, find_redis_server
from searchr1.core.run_connection import RunConnection
from searchr1.core.servers import free_port, port_is_free
from searchr1.core.settings import ConfigError, load_settings, read_config_file
from searchr1.launcher.cpu_placement import core_list
from searchr1.launcher.health import Gate, GrpcHealthGate, HttpGate, RedisPingGate
from searchr1.launcher.placement import (
    Placement,
    PlacementSettings,
    ProcessPlacement,
    placement_conflicts,
    plan_placement,
)
from searchr1.launcher.settings import LauncherSettings, RestartSettings
from searchr1.launcher.specs import (
    DEFAULT_TEMPLATES,
    LaunchPlan,
    ProcessSpec,
    cli_command,
    render_env,
    render_template,
)
from searchr1.launcher.tables import table_problems
from searchr1.launcher.validation_setup import validation_problems


class _Ports:
    """Resolves configured ports: fixed ones must be free (else a problem naming the process), 0 picks
    a free one distinct from every other port of the plan."""

    def __init__(self, host: str, problems: list[str]) -> None:
        self.host = host
        self.problems = problems
        self.used: dict[int, str] = {}

    def get(self, configured: int, owner: str) -> int:
        if configured:
            if configured in self.used:
                self.problems.append(f"port {configured} is configured for both {self.used[configured]} "
                                     f"and {owner}")
            elif not port_is_free(self.host, configured):
                self.problems.append(f"port {configured} ({owner}) is already in use on {self.host}: "
                                     f"stop whatever listens there or configure another port (0 = any free)")
            self.used[configured] = owner
            return configured
        for _ in range(100):
            port = free_port(self.host)
            if port not in self.used:
                self.used[port] = owner
                return port
        raise RuntimeError("could not find a free port")  # pragma: no cover


def restart_rule(settings: LauncherSettings, own: str | None) -> RestartSettings | None:
    """The restart table for a process whose own policy is `own` (None: the launcher's default policy)."""
    return settings.restart if (own or settings.restart.policy) == "on-failure" else None


def load_placement(config: str | Path) -> PlacementSettings | None:
    """The run config's `[placement]` table as `PlacementSettings` (env `PLACEMENT_*` over it), or None
    when the file has no such table (or cannot be read: `build_plan` reports a missing config)."""
    try:
        data = read_config_file(config)
    except (OSError, ConfigError):
        return None
    return load_settings(PlacementSettings, config) if "placement" in data else None


def _apply_placement(name: str, env: dict[str, str], configured: dict[str, str], where: ProcessPlacement,
                     problems: list[str]) -> dict[str, str]:
    """`env` with the placement's variables merged over it; a configured value that differs is a problem."""
    for key, value in where.env.items():
        if key in configured and env.get(key) != value:
            problems.append(f"{name}: its launcher env sets {key}={env.get(key)!r} but [placement] gives "
                            f"{value!r}; drop the env entry (the placement sets it)")
    return {**env, **where.env}


class _Planner:
    """The state `build_plan` fills in, one method per stage of the plan."""

    def __init__(self, settings: LauncherSettings, config_path: Path, run_root: Path,
                 placed: Placement | None) -> None:
        self.settings = settings
        self.config_path = config_path
        self.run_root = run_root
        self.placed = placed
        self.where = placed.by_name() if placed is not None else {}
        self.host = settings.host
        self.problems: list[str] = []
        self.ports = _Ports(self.host, self.problems)
        self.specs: list[ProcessSpec] = []
        self.preflight: list[Gate] = []
        self.templates = {**DEFAULT_TEMPLATES, **settings.templates}
        for table in ("templates", "commands"):
            unknown = sorted(set(getattr(settings, table)) - set(DEFAULT_TEMPLATES))
            if unknown:
                raise ConfigError(f"[launcher.{table}] has unknown process(es) {unknown}; "
                                  f"known: {sorted(DEFAULT_TEMPLATES)}")
        self.default_base = cli_command(settings)

    def base(self, kind: str) -> list[str]:
        """The command before the template's arguments: the configured one, else `searchr1`; the placed
        learner runs under torchrun."""
        if kind == "learner" and self.placed is not None and self.placed.learner.command_prefix:
            prefix = list(self.placed.learner.command_prefix)
            literal = [*prefix, "-m", "searchr1.cli"]
            if not self.settings.command and prefix[:1] == ["python"]:
                # the interpreter that runs every other service (no PATH lookup)
                prefix[:1] = [sys.executable]
            torchrun = [*prefix, "-m", "searchr1.cli"]
            configured = self.settings.commands.get("learner")
            if configured and list(configured) not in (torchrun, literal):
                self.problems.append(f"learner: [launcher.commands] learner = {configured} but [placement] "
                                     f"starts it with {torchrun}; drop the command (the placement sets it)")
            return torchrun
        return list(self.settings.commands.get(kind) or self.default_base)

    def redis(self) -> str:
        """Redis, started here unless an external one is configured; returns its URL."""
        settings, host = self.settings, self.host
        if settings.redis.url:
            self.preflight.append(RedisPingGate(settings.redis.url))
            return settings.redis.url
        redis_port = self.ports.get(settings.redis.port, "redis")
        password = secrets.token_hex(16)  # per run: in the processes' environment and Redis's stdin only
        redis_url = f"redis://:{password}@{host}:{redis_port}/0"
        try:
            binary = find_redis_server()
        except RedisNotFound as exc:
            self.problems.append(f"redis: {exc}")
            binary = "redis-server"
        self.specs.append(ProcessSpec(
            name="redis", stage="redis",
            argv=[binary, "-", "--port", str(redis_port), "--bind", host, "--save", "", "--appendonly", "yes",
                  "--appendfsync", settings.redis.appendfsync, "--dir", str(self.run_root / "redis"),
                  "--protected-mode", "no"],
            gates=[RedisPingGate(redis_url)], health_timeout_s=settings.redis.health_timeout_s,
            make_dirs=[self.run_root / "redis"], restart=restart_rule(settings, settings.redis.restart),
            stdin=f"requirepass {password}\n".encode(), cores=self.cores_of("redis"),
        ))
        return redis_url

    def index_build(self, index_dir: Path, common: dict[str, str]) -> None:
        """The one-shot index build, when the index directory is missing."""
        r = self.settings.retriever
        corpus = Path(r.corpus).resolve() if r.corpus else None
        if corpus is None:
            self.problems.append(f"retriever: index {index_dir} is missing and no corpus is configured to "
                                 f"build it ([launcher.retriever] corpus = \"…\")")
        elif not corpus.is_file():
            self.problems.append(f"index-build: corpus {corpus} not found (needed to build the missing index "
                                 f"{index_dir})")
        values = {**common, "corpus": str(corpus or ""), "index_kind": r.kind}
        self.specs.append(ProcessSpec(
            name="index-build", stage="index-build", oneshot=True, health_timeout_s=r.build_timeout_s,
            argv=self.base("index-build") + render_template("index-build", self.templates["index-build"], values),
            env=render_env("index-build", {}, values),
        ))

    def cores_of(self, name: str) -> tuple[int, ...]:
        """The cores the placement gives process `name` (empty: no core placement)."""
        where = self.where.get(name)
        return where.cores.cores if where is not None and where.cores is not None else ()

    def service(self, name: str, kind: str, proc: Any, values: dict[str, str], gates: list[Gate],
                **kw: Any) -> None:
        """One long-running process of kind `kind` (template, command, env) from its settings `proc`,
        placed on its GPUs and cores when the plan has a placement."""
        env = render_env(kind, proc.env, values)
        if name in self.where:
            env = _apply_placement(name, env, proc.env, self.where[name], self.problems)
        self.specs.append(ProcessSpec(
            name=name, stage=kind, health_timeout_s=proc.health_timeout_s, gates=gates,
            argv=self.base(kind) + render_template(kind, self.templates[kind], values) + list(proc.extra_args),
            env=env, restart=restart_rule(self.settings, proc.restart), cores=self.cores_of(name), **kw,
        ))

    def rollout_workers(self, common: dict[str, str]) -> int:
        """One rollout worker per `workers`, or per vLLM group of the placement; returns how many."""
        ro = self.settings.rollout
        workers = ro.workers
        if self.placed is not None:
            workers = len(self.placed.rollout)
            if "workers" in ro.model_fields_set and ro.workers != workers:
                self.problems.append(f"rollout: [launcher.rollout] workers = {ro.workers} but [placement] makes "
                                     f"{workers} vLLM workers; drop `workers` (the placement sets it)")
        for i in range(workers):
            worker_id = f"rollout-{i}"
            mport = self.ports.get(ro.metrics_port + i if ro.metrics_port else 0, f"{worker_id} metrics")
            self.service(worker_id, "rollout", ro,
                         {**common, "worker_id": worker_id, "worker_index": str(i), "metrics_port": str(mport)},
                         [HttpGate(f"http://{self.host}:{mport}/readyz")])
        return workers


SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
TORCHRUN_EXIT_S = 10
"""The part of `grace_period_s` left for torchrun's own exit after its ranks'."""


def torchrun_timeout_s(grace_period_s: float) -> int:
    """torchrun's wait between forwarding SIGTERM to the learner's ranks and killing them, under a launcher
    that kills torchrun itself `grace_period_s` after SIGTERM."""
    return max(1, int(grace_period_s) - TORCHRUN_EXIT_S)


def web_search_backend(config: Path) -> bool:
    """Whether the run's retriever answers from a web search API (`[retriever] backend = "web"`, or
    RETRIEVER_BACKEND): it needs no index, so none is built."""
    try:
        table = read_config_file(config).get("retriever", {}) if config.is_file() else {}
    except ConfigError:
        table = {}
    backend = os.environ.get("RETRIEVER_BACKEND") or (table.get("backend") if isinstance(table, dict) else None)
    return str(backend).lower() == "web"


def build_plan(settings: LauncherSettings, config: str | Path, run_dir: str | Path | None = None,
               placement: PlacementSettings | None = None) -> LaunchPlan:
    """The processes of `searchr1 up` in dependency order (see the module docstring). `placement`: the
    GPU placement to follow; default: the run config's `[placement]` table, if it has one."""
    config_path = Path(config).resolve()
    config_found = config_path.is_file()
    if placement is None and config_found:
        placement = load_placement(config_path)
    run_root = Path(run_dir if run_dir is not None else settings.run_dir).resolve()
    placed = plan_placement(placement, workers=settings.rollout.workers) if placement is not None else None
    plan = _Planner(settings, config_path, run_root, placed)
    notes: list[str] = []
    if not config_found:
        plan.problems.append(f"run config not found: {config_path}")
    else:
        table_issues, notes = table_problems(config_path)  # every service's table, as the service loads it
        plan.problems += table_issues
        if plan.placed is not None:  # a service table saying otherwise than the placement
            plan.problems += placement_conflicts(read_config_file(config_path), plan.placed)
    redis_url = plan.redis()
    host, r = settings.host, settings.retriever
    index_dir = Path(r.index_dir).resolve() if r.index_dir else run_root / "index"
    grpc_port = plan.ports.get(r.grpc_port, "retriever gRPC")
    http_port = plan.ports.get(r.http_port, "retriever HTTP")
    reward_port = plan.ports.get(settings.reward.port, "reward")
    common = {
        "config": str(config_path), "host": host, "run": settings.run, "run_dir": str(run_root),
        "log_dir": str(run_root / "logs"), "redis_url": redis_url, "index_dir": str(index_dir),
        "retriever_grpc": f"{host}:{grpc_port}", "retriever_http": f"http://{host}:{http_port}",
        "reward_url": f"http://{host}:{reward_port}", "token": secrets.token_urlsafe(24),
        "redis_password": urlparse(redis_url).password or "",
    }
    if not index_dir.exists() and not web_search_backend(config_path):
        plan.index_build(index_dir, common)
    plan.service("retriever", "retriever", r, {**common, "grpc_port": str(grpc_port), "http_port": str(http_port)},
                 [GrpcHealthGate(f"{host}:{grpc_port}"), HttpGate(f"http://{host}:{http_port}/healthz")])
    plan.service("reward", "reward", settings.reward, {**common, "port": str(reward_port)},
                 [HttpGate(f"http://{host}:{reward_port}/healthz")])
    workers = plan.rollout_workers(common)
    le = settings.learner
    lport = plan.ports.get(le.metrics_port, "learner metrics")
    plan.service("learner", "learner", le, {**common, "metrics_port": str(lport)},
                 [HttpGate(f"http://{host}:{lport}/readyz")], main=True)
    here = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    for spec in plan.specs:
        missing = sorted(set(spec.cores) - here) if here is not None else []
        if missing:
            plan.problems.append(f"{spec.name}: [placement] gives it cores {missing}, which this machine does not "
                                 f"let the launcher use (it may run on {core_list(here)})")
    # a `broadcast` weight transport's group is the learner and every worker (unless the env says otherwise)
    plan.specs[-1].env.setdefault("LEARNER_WEIGHTS__BROADCAST__RECEIVERS", str(workers))
    if plan.placed is not None:  # torchrun lets its ranks finish within the launcher's own grace
        plan.specs[-1].env.setdefault(SHUTDOWN_TIMEOUT_ENV, str(torchrun_timeout_s(settings.grace_period_s)))
    jsonl = Path(render_template("metrics_jsonl", [le.metrics_jsonl], {"run": settings.run,
                                                                        "run_dir": str(run_root)})[0])
    v = settings.validation
    vport = None
    if v.enabled:
        plan.problems += validation_problems(v, config_path, placed=plan.placed is not None)
        if v.metrics_port is not None:
            vport = plan.ports.get(v.metrics_port, "validation metrics")
    return LaunchPlan(
        specs=plan.specs, run_dir=run_root, redis_url=redis_url, run=settings.run,
        learner_metrics_url=f"http://{host}:{lport}/metrics", metrics_jsonl=jsonl.resolve(),
        problems=plan.problems, preflight_gates=plan.preflight, values=common, base_command=plan.default_base,
        placement=plan.placed,
        connection=RunConnection(run=settings.run, redis_url=redis_url, token=common["token"],
                                 retriever=common["retriever_grpc"], retriever_http=common["retriever_http"],
                                 reward=common["reward_url"], config=str(config_path),
                                 validation_metrics=f"http://{host}:{vport}/metrics" if vport else ""),
        validation_metrics_port=vport, notes=notes,
    )
