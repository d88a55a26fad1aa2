"""What `searchr1 up` runs: the one table of command templates and the `ProcessSpec`s built from settings.

`build_plan(settings, config)` turns `LauncherSettings` into a `LaunchPlan`: the processes in dependency
order (Redis → index build if the index is missing → retriever → reward → rollout workers → learner),
each with its argv, health gates, stage and timeouts, plus the problems found before anything starts
(a configured port already taken, `redis-server` not found, a corpus missing). Ports configured as 0
are resolved here to free ones, so every process's address is known before the first one starts.

The command lines live in `DEFAULT_TEMPLATES` only (run configs may override them per process with
`[launcher.templates]`): lists of arguments after the `searchr1` command, where `{name}` is replaced by
the values listed in `Placeholders`. This module runs nothing; `supervisor.py` does.

Placement: when the run config has a `[placement]` table (`searchr1.launcher.placement`), the plan
follows it: one rollout worker per vLLM group, each process's `CUDA_VISIBLE_DEVICES` and settings
overrides merged over its environment, and the learner started under `torchrun` (as
`python -m torch.distributed.run` of this interpreter unless `[launcher] command` is set, so that no
PATH lookup is involved). A `[launcher.*]`
entry that contradicts the placement (an env value, `rollout.workers`, `commands.learner`) is a
problem, not silently overridden.

Redis is started as a supervised process like the others (same logs, process
group, death detection, restart and shutdown order) using `searchr1.core.redis_server.find_redis_server`,
instead of through the `RedisServer` helper itself, and unlike that helper (a throw-away server for tests)
with an append-only file in `RUN_DIR/redis`: restarted after a crash on the same port and directory, it
comes back with every stream entry, consumer group and pending list it had
(`[launcher.redis] appendfsync`).

Restarts: each long-running process's `ProcessSpec.restart` is the `[launcher.restart]` table when its
policy (the process's own `restart`, else the table's `policy`) is `on-failure`, None when `never`; a
one-shot process (the index build) is never restarted.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.redis_server import RedisNotFound, find_redis_server
from searchr1.core.servers import free_port, port_is_free
from searchr1.core.settings import ConfigError, load_settings, read_config_file
from searchr1.launcher.health import Gate, GrpcHealthGate, HttpGate, RedisPingGate
from searchr1.launcher.placement import Placement, PlacementSettings, ProcessPlacement, plan_placement
from searchr1.launcher.settings import LauncherSettings, RestartSettings

# The command templates: arguments after the `searchr1` command (settings.command). ONE place to adjust.
DEFAULT_TEMPLATES: dict[str, list[str]] = {
    "index-build": ["index", "build", "--corpus", "{corpus}", "--kind", "{index_kind}", "--out", "{index_dir}"],
    "retriever": ["serve", "retriever", "--index", "{index_dir}", "--host", "{host}",
                  "--grpc-port", "{grpc_port}", "--http-port", "{http_port}", "--config", "{config}"],
    "reward": ["serve", "reward", "--host", "{host}", "--port", "{port}", "--config", "{config}"],
    "rollout": ["serve", "rollout", "--config", "{config}", "--worker-id", "{worker_id}",
                "--redis", "{redis_url}", "--run", "{run}", "--retriever", "{retriever_grpc}",
                "--reward", "{reward_url}", "--metrics-port", "{metrics_port}"],
    "learner": ["train", "--config", "{config}", "--redis", "{redis_url}", "--run", "{run}",
                "--metrics-port", "{metrics_port}"],
    # `searchr1 demo`'s evaluation runs: the retriever and reward service, then this as the main process.
    "eval": ["eval", "--config", "{config}", "--retriever", "{retriever_grpc}", "--reward", "{reward_url}"],
}

# Environment given to a process on top of the launcher's own (values are templates too). The learner's
# CLI has no --log-dir flag, so its log dir reaches LearnerSettings.log_dir through its env prefix: its
# JSONL step log lands in RUN_DIR/learner/{run}.jsonl, where the status line reads it.
DEFAULT_ENV: dict[str, dict[str, str]] = {
    # Everything a run writes lives under its run directory, so two runs never share (or resume from)
    # each other's snapshots and checkpoints. Env beats the run config's [learner.weights]/[learner.checkpoint].
    "learner": {"LEARNER_LOG_DIR": "{run_dir}/learner", "LEARNER_WEIGHTS__DIR": "{run_dir}/weights",
                "LEARNER_CHECKPOINT__DIR": "{run_dir}/checkpoints", "LEARNER_ARCHIVE__DIR": "{run_dir}/archive"},
}

PLACEHOLDERS = {
    "config": "absolute path of the run config",
    "host": "loopback interface (settings.host)",
    "run": "run name",
    "run_dir": "absolute run directory",
    "log_dir": "RUN_DIR/logs",
    "redis_url": "redis://host:port/0 of the started (or external) Redis",
    "index_dir": "absolute index directory",
    "corpus": "absolute corpus path (index build)",
    "index_kind": "index kind (index build)",
    "retriever_grpc": "host:port of the retriever's gRPC server",
    "retriever_http": "http://host:port of the retriever's HTTP server",
    "reward_url": "http://host:port of the reward service",
    "grpc_port": "this process's gRPC port (retriever)",
    "http_port": "this process's HTTP port (retriever)",
    "port": "this process's HTTP port (reward)",
    "metrics_port": "this process's Prometheus port (rollout, learner)",
    "worker_id": "rollout-i (rollout)",
    "worker_index": "i (rollout)",
}


@dataclass
class ProcessSpec:
    """One process the launcher runs."""

    name: str
    """Unique name: log prefix and `RUN_DIR/logs/<name>.log`."""
    argv: list[str]
    """Full command line."""
    stage: str
    """Processes of one stage start together (then are gated together) and stop together."""
    gates: list[Gate] = field(default_factory=list)
    """Health checks that must all pass before the next stage starts."""
    health_timeout_s: float = 60.0
    """How long the gates (or a one-shot process) may take."""
    oneshot: bool = False
    """Runs to completion (exit 0 required) before the next stage, e.g. the index build."""
    main: bool = False
    """Its exit ends the run and becomes the launcher's exit code (the learner)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables (on top of the launcher's own)."""
    make_dirs: list[Path] = field(default_factory=list)
    """Directories created just before the process starts."""
    restart: RestartSettings | None = None
    """Restart rule after a crash once the run is up (None: a death ends the run)."""


@dataclass
class LaunchPlan:
    """Everything `searchr1 up` will run, and what it found wrong before running anything."""

    specs: list[ProcessSpec]
    run_dir: Path
    redis_url: str
    run: str
    learner_metrics_url: str | None
    metrics_jsonl: Path
    problems: list[str] = field(default_factory=list)
    """Reasons to refuse (port taken, dependency missing); empty = good to go."""
    values: dict[str, str] = field(default_factory=dict)
    """The resolved placeholders shared by every process (addresses, ports, paths)."""
    base_command: list[str] = field(default_factory=list)
    """How `searchr1` is invoked (settings.command or this interpreter)."""
    preflight_gates: list[Gate] = field(default_factory=list)
    """Checks of things the launcher does not start (an external Redis) that must pass before anything
    starts."""
    placement: Placement | None = None
    """The GPU placement the plan follows (None: the config has no `[placement]` table)."""

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"


def total_steps(config: Path) -> int | None:
    """The learner's `[learner.optim] total_steps` in the run config, for the progress bar (None when the
    file does not name it: the bar then shows activity without an end)."""
    try:
        table: Any = read_config_file(config)
    except (OSError, ValueError):
        return None
    for key in ("learner", "optim"):
        table = table.get(key) if isinstance(table, dict) else None
    steps = table.get("total_steps") if isinstance(table, dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None


def cli_command(settings: LauncherSettings) -> list[str]:
    """How to invoke `searchr1`: settings.command, or this interpreter running the CLI module."""
    return list(settings.command) or [sys.executable, "-m", "searchr1.cli"]


def render_template(name: str, template: list[str], values: dict[str, str]) -> list[str]:
    """Substitute `{placeholder}`s in each argument; an unknown placeholder is a config error."""
    out = []
    for arg in template:
        try:
            out.append(arg.format_map(values))
        except KeyError as exc:
            raise ConfigError(
                f"command template {name!r} uses unknown placeholder {{{exc.args[0]}}} in {arg!r}; "
                f"known here: {', '.join(sorted(values))}") from None
        except (ValueError, IndexError) as exc:
            raise ConfigError(f"command template {name!r}: bad argument {arg!r}: {exc}") from None
    return out


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


def render_env(name: str, configured: dict[str, str], values: dict[str, str]) -> dict[str, str]:
    """The process's environment additions: DEFAULT_ENV[name] overridden by `configured`, rendered."""
    merged = {**DEFAULT_ENV.get(name, {}), **configured}
    return {key: render_template(f"{name} env", [value], values)[0] for key, value in merged.items()}


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
    """The processes of `searchr1 up` in dependency order (see module docstring). `placement`: the GPU
    placement to follow; default: the run config's `[placement]` table, if it has one."""
    problems: list[str] = []
    config_path = Path(config).resolve()
    if not config_path.is_file():
        problems.append(f"run config not found: {config_path}")
    if placement is None and config_path.is_file():
        placement = load_placement(config_path)
    placed = plan_placement(placement) if placement is not None else None
    where = placed.by_name() if placed is not None else {}
    run_root = Path(run_dir if run_dir is not None else settings.run_dir).resolve()
    host = settings.host
    ports = _Ports(host, problems)
    templates = {**DEFAULT_TEMPLATES, **settings.templates}
    for table in ("templates", "commands"):
        unknown = sorted(set(getattr(settings, table)) - set(DEFAULT_TEMPLATES))
        if unknown:
            raise ConfigError(f"[launcher.{table}] has unknown process(es) {unknown}; "
                              f"known: {sorted(DEFAULT_TEMPLATES)}")
    default_base = cli_command(settings)

    def base(kind: str) -> list[str]:
        if kind == "learner" and placed is not None:
            prefix = list(placed.learner.command_prefix)
            literal = [*prefix, "-m", "searchr1.cli"]
            if not settings.command and prefix[:1] == ["torchrun"]:
                # torchrun of the interpreter that runs every other service (no PATH lookup)
                prefix[:1] = [sys.executable, "-m", "torch.distributed.run"]
            torchrun = [*prefix, "-m", "searchr1.cli"]
            configured = settings.commands.get("learner")
            if configured and list(configured) not in (torchrun, literal):
                problems.append(f"learner: [launcher.commands] learner = {configured} but [placement] starts it "
                                f"with {torchrun}; drop the command (the placement sets it)")
            return torchrun
        return list(settings.commands.get(kind) or default_base)
    specs: list[ProcessSpec] = []

    # Redis: started here unless an external one is configured.
    preflight: list[Gate] = []
    if settings.redis.url:
        redis_url = settings.redis.url
        preflight.append(RedisPingGate(redis_url))
    else:
        redis_port = ports.get(settings.redis.port, "redis")
        redis_url = f"redis://{host}:{redis_port}/0"
        try:
            binary = find_redis_server()
        except RedisNotFound as exc:
            problems.append(f"redis: {exc}")
            binary = "redis-server"
        specs.append(ProcessSpec(
            name="redis", stage="redis",
            argv=[binary, "--port", str(redis_port), "--bind", host, "--save", "", "--appendonly", "yes",
                  "--appendfsync", settings.redis.appendfsync, "--dir", str(run_root / "redis"),
                  "--protected-mode", "no"],
            gates=[RedisPingGate(redis_url)], health_timeout_s=settings.redis.health_timeout_s,
            make_dirs=[run_root / "redis"], restart=restart_rule(settings, settings.redis.restart),
        ))

    r = settings.retriever
    index_dir = Path(r.index_dir).resolve() if r.index_dir else run_root / "index"
    grpc_port = ports.get(r.grpc_port, "retriever gRPC")
    http_port = ports.get(r.http_port, "retriever HTTP")
    reward_port = ports.get(settings.reward.port, "reward")
    common = {
        "config": str(config_path), "host": host, "run": settings.run, "run_dir": str(run_root),
        "log_dir": str(run_root / "logs"), "redis_url": redis_url, "index_dir": str(index_dir),
        "retriever_grpc": f"{host}:{grpc_port}", "retriever_http": f"http://{host}:{http_port}",
        "reward_url": f"http://{host}:{reward_port}",
    }

    if not index_dir.exists() and not web_search_backend(config_path):
        corpus = Path(r.corpus).resolve() if r.corpus else None
        if corpus is None:
            problems.append(f"retriever: index {index_dir} is missing and no corpus is configured to build it "
                            f"([launcher.retriever] corpus = \"…\")")
        elif not corpus.is_file():
            problems.append(f"index-build: corpus {corpus} not found (needed to build the missing index "
                            f"{index_dir})")
        values = {**common, "corpus": str(corpus or ""), "index_kind": r.kind}
        specs.append(ProcessSpec(
            name="index-build", stage="index-build", oneshot=True, health_timeout_s=r.build_timeout_s,
            argv=base("index-build") + render_template("index-build", templates["index-build"], values),
            env=render_env("index-build", {}, values),
        ))

    def service(name: str, kind: str, proc: Any, values: dict[str, str], gates: list[Gate], **kw: Any) -> None:
        """One long-running process of kind `kind` (template, command, env) from its settings `proc`,
        placed on its GPUs when the plan has a placement."""
        env = render_env(kind, proc.env, values)
        if name in where:
            env = _apply_placement(name, env, proc.env, where[name], problems)
        specs.append(ProcessSpec(
            name=name, stage=kind, health_timeout_s=proc.health_timeout_s, gates=gates,
            argv=base(kind) + render_template(kind, templates[kind], values) + list(proc.extra_args),
            env=env, restart=restart_rule(settings, proc.restart), **kw,
        ))

    service("retriever", "retriever", r, {**common, "grpc_port": str(grpc_port), "http_port": str(http_port)},
            [GrpcHealthGate(f"{host}:{grpc_port}"), HttpGate(f"http://{host}:{http_port}/health")])
    service("reward", "reward", settings.reward, {**common, "port": str(reward_port)},
            [HttpGate(f"http://{host}:{reward_port}/health")])
    ro = settings.rollout
    workers = ro.workers
    if placed is not None:
        workers = len(placed.rollout)
        if "workers" in ro.model_fields_set and ro.workers != workers:
            problems.append(f"rollout: [launcher.rollout] workers = {ro.workers} but [placement] makes {workers} "
                            f"vLLM workers; drop `workers` (the placement sets it)")
    for i in range(workers):
        worker_id = f"rollout-{i}"
        mport = ports.get(ro.metrics_port + i if ro.metrics_port else 0, f"{worker_id} metrics")
        service(worker_id, "rollout", ro,
                {**common, "worker_id": worker_id, "worker_index": str(i), "metrics_port": str(mport)},
                [HttpGate(f"http://{host}:{mport}/readyz")])
    le = settings.learner
    lport = ports.get(le.metrics_port, "learner metrics")
    learner_metrics_url = f"http://{host}:{lport}/metrics"
    service("learner", "learner", le, {**common, "metrics_port": str(lport)}, [HttpGate(f"http://{host}:{lport}/readyz")],
            main=True)
    jsonl = Path(render_template("metrics_jsonl", [le.metrics_jsonl], {"run": settings.run,
                                                                        "run_dir": str(run_root)})[0])
    return LaunchPlan(
        specs=specs, run_dir=run_root, redis_url=redis_url, run=settings.run,
        learner_metrics_url=learner_metrics_url,
        metrics_jsonl=jsonl.resolve(),
        problems=problems, preflight_gates=preflight, values=common, base_command=default_base,
        placement=placed,
    )


def dry_run_lines(plan: LaunchPlan) -> list[str]:
    """`searchr1 up --dry-run`'s text: per process its name and stage, the GPUs it sees
    (`CUDA_VISIBLE_DEVICES`: "none" when hidden, "all" when unset), its command line and the
    environment the launcher adds; then the placement summary when the plan has one."""
    lines = []
    for spec in plan.specs:
        devices = spec.env.get("CUDA_VISIBLE_DEVICES")
        gpus = "all" if devices is None else devices or "none"
        lines.append(f"{spec.name} ({spec.stage}, GPUs: {gpus})")
        lines.append(f"  $ {shlex.join(spec.argv)}")
        for key, value in spec.env.items():
            lines.append(f"  {key}={value}")
    if plan.placement is not None:
        p = plan.placement
        lines.append(f"placement: {len(p.rollout)} vLLM worker(s) on GPUs "
                     f"{' | '.join(w.cuda_visible_devices for w in p.rollout)}; learner: "
                     f"{len(p.learner.gpus)} FSDP rank(s) on GPUs {p.learner.cuda_visible_devices}; retriever: "
                     f"{'GPU ' + p.retriever.cuda_visible_devices if p.retriever.gpus else 'CPU'}")
    return lines


def eval_plan(plan: LaunchPlan, eval_args: list[str], templates: dict[str, list[str]] | None = None) -> LaunchPlan:
    """The same plan with the rollout workers, the learner and Redis replaced by one main `searchr1 eval`
    process (template `eval` + `eval_args`) against the plan's retriever and reward service: what
    `searchr1 demo` uses to evaluate a checkpoint through the real services. The eval process runs the
    rollout engine, so it gets the rollout workers' environment (e.g. `VLLM_CPU_KVCACHE_SPACE`)."""
    template = {**DEFAULT_TEMPLATES, **(templates or {})}["eval"]
    keep = [s for s in plan.specs if s.stage in ("index-build", "retriever", "reward")]
    rollout_env = next((s.env for s in plan.specs if s.stage == "rollout"), {})
    main = ProcessSpec(name="eval", stage="eval", main=True, health_timeout_s=3600.0, env=dict(rollout_env),
                       argv=list(plan.base_command) + render_template("eval", template, plan.values) + list(eval_args))
    return LaunchPlan(specs=[*keep, main], run_dir=plan.run_dir, redis_url=plan.redis_url, run=plan.run,
                      learner_metrics_url=None, metrics_jsonl=plan.metrics_jsonl, problems=list(plan.problems),
                      preflight_gates=[], values=dict(plan.values), base_command=list(plan.base_command))
