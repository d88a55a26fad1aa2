"""What `searchr1 up` runs: the one table of command templates and the `ProcessSpec`s built from settings.

`planner.build_plan(settings, config)` turns `LauncherSettings` into a `LaunchPlan`: the processes in
dependency order (Redis → index build if the index is missing → retriever → reward → rollout workers →
learner), each with its argv, health gates, stage and timeouts, plus the problems found before anything
starts (a configured port already taken, `redis-server` not found, a corpus missing). Ports configured as 0
are resolved to free ones, so every process's address is known before the first one starts.

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

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.redaction import redact_config
from searchr1.core.run_connection import RunConnection
from searchr1.core.settings import ConfigError, read_config_file
from searchr1.launcher.cpu_placement import core_list
from searchr1.launcher.health import Gate
from searchr1.launcher.placement import Placement
from searchr1.launcher.settings import LauncherSettings, RestartSettings

# The command templates: arguments after the `searchr1` command (settings.command). ONE place to adjust.
DEFAULT_TEMPLATES: dict[str, list[str]] = {
    "index-build": ["index", "build", "--corpus", "{corpus}", "--kind", "{index_kind}", "--out", "{index_dir}"],
    "retriever": ["serve", "retriever", "--index", "{index_dir}", "--host", "{host}",
                  "--grpc-port", "{grpc_port}", "--http-port", "{http_port}", "--config", "{config}"],
    "reward": ["serve", "reward", "--host", "{host}", "--port", "{port}", "--config", "{config}"],
    "rollout": ["serve", "rollout", "--config", "{config}", "--worker-id", "{worker_id}", "--run", "{run}",
                "--retriever", "{retriever_grpc}", "--reward", "{reward_url}", "--metrics-port", "{metrics_port}"],
    # The learner's run name goes by environment (LEARNER_REDIS__RUN, below): under torchrun an argument
    # `--run` after `-m searchr1.cli` is read by torchrun's own parser as an abbreviation of its `--run-path`.
    "learner": ["train", "--config", "{config}", "--metrics-port", "{metrics_port}"],
    # `searchr1 demo`'s evaluation runs: the retriever and reward service, then this as the main process.
    "eval": ["eval", "--config", "{config}", "--retriever", "{retriever_grpc}", "--reward", "{reward_url}"],
}

# Environment given to a process on top of the launcher's own (values are templates too). The learner's
# CLI has no --log-dir flag, so its log dir reaches LearnerSettings.log_dir through its env prefix: its
# JSONL step log lands in RUN_DIR/learner/{run}.jsonl, where the status line reads it.
DEFAULT_ENV: dict[str, dict[str, str]] = {
    # Everything a run writes lives under its run directory, so two runs never share (or resume from)
    # each other's snapshots and checkpoints (nor a worker another's local copies). Env beats the run config's
    # [learner.weights]/[learner.checkpoint]/[rollout.weights].
    "learner": {"LEARNER_REDIS__RUN": "{run}", "LEARNER_LOG_DIR": "{run_dir}/learner", "LEARNER_WEIGHTS__DIR": "{run_dir}/weights",
                "LEARNER_CHECKPOINT__DIR": "{run_dir}/checkpoints", "LEARNER_ARCHIVE__DIR": "{run_dir}/archive"},
    "rollout": {"ROLLOUT_WEIGHTS__DOWNLOAD_DIR": "{run_dir}/rollout-weights/{worker_id}"},
}

# Secrets reach the processes through their environment, never their argv (which `ps` shows every user of
# the host): the Redis URL (it carries the password of the Redis `up` starts) and the run's bearer token,
# which every server requires and every client sends. A process's `[launcher.<name>] env` overrides them.
SECRET_ENV: dict[str, dict[str, str]] = {
    "retriever": {"RETRIEVER_TOKEN": "{token}"},
    "reward": {"REWARD_TOKEN": "{token}"},
    "rollout": {"ROLLOUT_REDIS__URL": "{redis_url}", "ROLLOUT_RETRIEVER__TOKEN": "{token}",
                "ROLLOUT_REWARD__TOKEN": "{token}", "ROLLOUT_WEIGHTS__TOKEN": "{token}"},
    "learner": {"LEARNER_REDIS__URL": "{redis_url}", "LEARNER_WEIGHTS__TOKEN": "{token}"},
}

PLACEHOLDERS = {
    "config": "absolute path of the run config",
    "host": "loopback interface (settings.host)",
    "run": "run name",
    "run_dir": "absolute run directory",
    "log_dir": "RUN_DIR/logs",
    "redis_url": "redis://:password@host:port/0 of the started (or external) Redis (a secret: the processes "
                 "get it as ROLLOUT_REDIS__URL / LEARNER_REDIS__URL)",
    "redis_password": "the password of that Redis (a secret: for a process's env, e.g. a Redis URL through a "
                      "proxy: ROLLOUT_REDIS__URL = \"redis://:{redis_password}@127.0.0.1:6380/0\")",
    "token": "the run's bearer token, generated per run (a secret: the processes get it by environment)",
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
    health_timeout_s: float = field(kw_only=True)
    """How long the gates (or a one-shot process) may take (the process's `health_timeout_s` setting)."""
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
    stdin: bytes | None = None
    """Written to the process's stdin, then closed (Redis reads its password there); None: /dev/null."""
    cores: tuple[int, ...] = ()
    """CPU cores the process (and its children) may run on, set as its affinity before it starts (empty:
    wherever the OS puts it)."""


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
    connection: RunConnection | None = None
    """How commands reach this run (`RUN_DIR/connection.json`, mode 0600, written before anything starts)."""
    validation_metrics_port: int | None = None
    """Port of the launcher's validation gauges (None: validation off, or not served)."""
    notes: list[str] = field(default_factory=list)
    """What is worth saying but stops nothing (a config table no service reads)."""

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


def render_env(name: str, configured: dict[str, str], values: dict[str, str]) -> dict[str, str]:
    """The process's environment additions: DEFAULT_ENV[name] and SECRET_ENV[name] overridden by
    `configured`, rendered."""
    merged = {**DEFAULT_ENV.get(name, {}), **SECRET_ENV.get(name, {}), **configured}
    return {key: render_template(f"{name} env", [value], values)[0] for key, value in merged.items()}


def dry_run_lines(plan: LaunchPlan) -> list[str]:
    """`searchr1 up --dry-run`'s text: per process its name and stage, the GPUs it sees
    (`CUDA_VISIBLE_DEVICES`: "none" when hidden, "all" when unset) and, with a core placement, its cores,
    its command line and the environment the launcher adds; then the placement summary when the plan has
    one."""
    lines = []
    for spec in plan.specs:
        devices = spec.env.get("CUDA_VISIBLE_DEVICES")
        gpus = "all" if devices is None else devices or "none"
        cores = f", cores: {core_list(spec.cores)}" if spec.cores else ""
        lines.append(f"{spec.name} ({spec.stage}, GPUs: {gpus}{cores})")
        lines.append(f"  $ {shlex.join(spec.argv)}")
        for key, value in redact_config(spec.env).items():
            lines.append(f"  {key}={value}")
    p = plan.placement
    if p is not None and p.places_gpus:
        lines.append(f"placement: {len(p.rollout)} vLLM worker(s) on GPUs "
                     f"{' | '.join(w.cuda_visible_devices for w in p.rollout)}; learner: "
                     f"{len(p.learner.gpus)} FSDP rank(s) on GPUs {p.learner.cuda_visible_devices}; retriever: "
                     f"{'GPU ' + p.retriever.cuda_visible_devices if p.retriever.gpus else 'CPU'}")
    if p is not None and p.places_cores:
        shares = []
        for name, proc in p.by_name().items():
            share = proc.cores
            assert share is not None
            shares.append(f"{name} {share.cpuset}" + (f" (with {share.with_role})" if share.with_role else ""))
        lines.append("cores: " + " | ".join(shares))
    return lines


def eval_env(plan: LaunchPlan) -> dict[str, str]:
    """The environment an evaluation against the plan's services gets: the rollout workers' (the engine's
    settings, the retriever and reward tokens), less the launcher's per-worker defaults (a worker's
    weight-copy directory) and the Redis URL (an evaluation runs without Redis). Without rollout workers
    (`workers = 0`), the tokens a worker would get."""
    rollout_env = next((s.env for s in plan.specs if s.stage == "rollout"), None)
    if rollout_env is None:
        rollout_env = render_env("rollout", {}, {**plan.values, "worker_id": "validation", "worker_index": "0"})
    return {k: v for k, v in rollout_env.items() if k not in {*DEFAULT_ENV["rollout"], "ROLLOUT_REDIS__URL"}}


def eval_plan(plan: LaunchPlan, eval_args: list[str], templates: dict[str, list[str]] | None = None) -> LaunchPlan:
    """The same plan with the rollout workers, the learner and Redis replaced by one main `searchr1 eval`
    process (template `eval` + `eval_args`) against the plan's retriever and reward service: what
    `searchr1 demo` uses to evaluate a checkpoint through the real services. The eval process runs the
    rollout engine, so it gets the rollout workers' environment (e.g. `VLLM_CPU_KVCACHE_SPACE`) less the
    launcher's own per-worker defaults (a worker's weight-copy directory) and the Redis URL (it runs without
    Redis); it keeps the tokens it sends to the retriever and the reward service."""
    template = {**DEFAULT_TEMPLATES, **(templates or {})}["eval"]
    keep = [s for s in plan.specs if s.stage in ("index-build", "retriever", "reward")]
    env = eval_env(plan)
    main = ProcessSpec(name="eval", stage="eval", main=True, health_timeout_s=3600.0, env=env,
                       argv=list(plan.base_command) + render_template("eval", template, plan.values) + list(eval_args))
    return LaunchPlan(specs=[*keep, main], run_dir=plan.run_dir, redis_url=plan.redis_url, run=plan.run,
                      learner_metrics_url=None, metrics_jsonl=plan.metrics_jsonl, problems=list(plan.problems),
                      preflight_gates=[], values=dict(plan.values), base_command=list(plan.base_command))
