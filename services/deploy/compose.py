"""`searchr1 deploy compose CONFIG`: a complete compose project that runs one run config on one GPU node.

From the config's plan (`plan.py`: the `[placement]` table `searchr1 up` and the Kubernetes gpu overlays
use, the learner's grace) and docker-compose.yml's services it writes:

- `name:` the run's (`searchr1-3b-grpo`): the project's containers, network and volumes are its own, so
  the tiny world's `docker compose down -v` beside it deletes none of them (Compose v1.29 does not read a
  top-level name: `--compose-v1` leaves it out and every command then names the project with `-p`);
- `data`, one shot, first: the inputs the config names onto the `inputs` and `models` volumes (train
  parquet by `searchr1 data fetch`, the policy and the retriever's encoder from the Hugging Face Hub or a
  local mirror mounted at /mirror, the index by `searchr1 index fetch` from `--index-repo`); each step is
  skipped when its output is there. Every other searchr1 service but `learner-check` waits for it
  (`service_completed_successfully`), so `up -d` of the whole project waits as long as the data step:
  the header says to start `data` alone first;
- `retriever` on the placement's GPU (query encoder on CUDA; FAISS too with `[placement.retriever]
  faiss_gpu`) or on CPU, its healthcheck's start period sized from the index the data step fetches: the
  catalogue's entry for `--index-repo` (`searchr1.retriever.fetch.KNOWN_INDEXES`), or `--index-bytes`;
- `rollout-gpu-0`, `-1`, … one per vLLM worker and `learner-gpus` (the learner's FSDP ranks under
  `searchr1.learner.torchrun`), each given exactly its GPUs by `device_ids` (`_place`), with the network
  aliases Prometheus discovers; the learner's `stop_grace_period` and torchrun's
  `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` are the learner's grace (`plan.py`); `learner-check`, one shot before
  the learner: `searchr1 train --check` with the learner's config and environment, so a run its Redis
  cannot hold stops there once instead of a learner restarted forever;
- redis (maxmemory sized by the run: `searchr1.learner.redis_budget`), reward, Prometheus, Alertmanager,
  Grafana as in docker-compose.yml.

Every searchr1 service mounts the config read-only at /app/configs/run.toml and reads it. There is no CPU
`rollout`/`learner` service, no tiny-world `init` and no profile in this project: one learner, always. An
index directory that is not where the data step puts the fetched index is refused. A GPU the placement
leaves idle is named in the header. GPU kernels compiled at first use (Triton, inductor, vLLM) land on
the `cache` volume and are reused by the next start.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from searchr1.deploy import DeployError
from searchr1.deploy.plan import DeployPlan

__all__ = ["ComposeOptions", "compose_project", "readiness_budget_s", "index_size", "trainers", "data_script",
           "default_model_repo"]

CONFIG_IN_CONTAINER = "configs/run.toml"
IMAGE = "${SEARCHR1_GPU_IMAGE:-searchr1:gpu}"
SLOW_READ_BYTES_PER_S = 100e6
"""Read rate the retriever's readiness budget assumes (a network volume; local NVMe is 10-30× faster)."""
START_OVERHEAD_S = 300.0
"""Encoder load, corpus map, CUDA context and server start on top of reading the index."""
INPUT_MOUNTS = ["inputs:/app/data", "models:/app/models", "cache:/app/.cache"]
VOLUMES = ("data", "inputs", "models", "cache", "redis", "prometheus", "alertmanager")
AFTER_DATA = {"data": {"condition": "service_completed_successfully"}}
AFTER_REDIS = {"redis": {"condition": "service_healthy"}}


@dataclass(frozen=True)
class ComposeOptions:
    """What the data step fetches, and how the file is written."""

    model_repo: str | None = None
    """Hub repository of the policy (default: `Qwen/<model directory name>`)."""
    index_repo: str | None = None
    """Hub dataset the data step fetches the index from (default: Search-R1's wiki-18 e5 index)."""
    index_bytes: int | None = None
    """That index file's size, for an index the catalogue does not know."""
    encoder_repo: str | None = None
    """Hub repository of the index's encoder (default: the catalogue's)."""
    encoder_dir: str = "models/e5-base-v2"
    """Where the data step puts the encoder."""
    compose_v1: bool = False
    """Leave out the top-level `name:` (docker-compose v1.29 refuses it); commands then take `-p NAME`."""


def readiness_budget_s(index_bytes: int, floor_s: float = 0.0) -> int:
    """Seconds the retriever may take to become ready: reading `index_bytes` at `SLOW_READ_BYTES_PER_S`
    plus `START_OVERHEAD_S`, at least `floor_s` (the config's own `launcher.retriever.health_timeout_s`),
    rounded up to a whole minute."""
    need = max(index_bytes / SLOW_READ_BYTES_PER_S + START_OVERHEAD_S, floor_s)
    return int(-(-need // 60) * 60)


class _Dumper(yaml.SafeDumper):
    """No anchors/aliases (each service written out whole); multi-line strings as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_Dumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v,
                                                             style="|" if "\n" in v else None))


def _place(service: dict[str, Any], proc: Any) -> None:
    """Give `service` what the placement gives its process (`ProcessPlacement`): exactly its GPUs, its
    cores when the placement lists them (`cpuset`), and the settings that follow from them
    (`CUDA_VISIBLE_DEVICES` aside: compose numbers a container's GPUs from 0). The one place a process's
    resources become compose keys."""
    service["environment"].update({k: v for k, v in proc.env.items() if k != "CUDA_VISIBLE_DEVICES"})
    if proc.cores is not None:  # the placement's cores (`[placement] cores`): the container's cpuset
        service["cpuset"] = proc.cores.cpuset
    if proc.gpus:
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": [str(d) for d in proc.gpus], "capabilities": ["gpu"]}]}}}


def _with_run_config(argv: list[str], run: str) -> list[str]:
    """A service command reading the run config and naming the run."""
    out = [CONFIG_IN_CONTAINER if a == "configs/compose.toml" else a for a in argv]
    if "--run" in out:
        out[out.index("--run") + 1] = run
    return out


def _searchr1(template: dict[str, Any], config_mount: str, alias: str | None = None) -> dict[str, Any]:
    s = copy.deepcopy(template)
    for key in ("profiles", "build", "deploy", "networks"):
        s.pop(key, None)
    s["image"] = IMAGE
    s["volumes"] = ["data:/app/runs", f"{config_mount}:/app/{CONFIG_IN_CONTAINER}:ro", *INPUT_MOUNTS]
    s["environment"] = dict(s.get("environment", {}))
    if alias:
        s["networks"] = {"default": {"aliases": [alias]}}
    return s


def data_script(dataset: str, model: str, model_repo: str, index_dir: str, encoder_dir: str,
                encoder_repo: str) -> str:
    """The data service's shell script (compose escapes `$` as `$$`); each step skipped when done."""
    data_dir = str(Path(dataset).parent)
    index_parent = str(Path(index_dir).parent)
    return "\n".join([
        "set -eu",
        "cd /app",
        "fetch_model() {  # repo, directory: from /mirror/<repo> when mounted, else the Hugging Face Hub",
        '  [ -f "$$2/config.json" ] && return 0',
        '  if [ -d "/mirror/$$1" ]; then mkdir -p "$$2" && cp -r "/mirror/$$1/." "$$2/"',
        '  else hf download "$$1" --local-dir "$$2"; fi',
        "}",
        f'[ -f {dataset} ] || searchr1 data fetch {data_dir} --repo "$$SEARCHR1_DATA_REPO"',
        f"fetch_model {encoder_repo} {encoder_dir}",
        f"fetch_model {model_repo} {model}",
        f"[ -f {index_dir}/manifest.json ] || searchr1 index fetch --out {index_parent} --encoder {encoder_dir} "
        '--index-repo "$$SEARCHR1_INDEX_REPO" --corpus-repo "$$SEARCHR1_CORPUS_REPO" --no-keep-parts',
        "du -sh data models",
        'echo "data ready"',
        "",
    ])


def data_env(index_repo: str) -> dict[str, str]:
    """The data service's sources, each overridable from .env (a Hub mirror, a local dataset copy); the
    index repository defaults to the one the readiness budget was sized for."""
    from searchr1.retriever.fetch import CORPUS_REPO

    return {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "${HF_ENDPOINT:-https://huggingface.co}", "HF_TOKEN": "${HF_TOKEN:-}",
            "SEARCHR1_DATA_REPO": "${SEARCHR1_DATA_REPO:-RUC-NLPIR/FlashRAG_datasets}",
            "SEARCHR1_INDEX_REPO": f"${{SEARCHR1_INDEX_REPO:-{index_repo}}}",
            "SEARCHR1_CORPUS_REPO": f"${{SEARCHR1_CORPUS_REPO:-{CORPUS_REPO}}}"}


def index_size(index_repo: str, kind: str, index_bytes: int | None = None) -> tuple[int, str]:
    """(bytes, how they were found) of the index the data step fetches from `index_repo`: `index_bytes`
    when given, else the catalogue's entry (`KNOWN_INDEXES`), whose kind must be the config's `kind`."""
    from searchr1.retriever.fetch import KNOWN_INDEXES

    if index_bytes is not None:
        return index_bytes, f"{index_repo}: {index_bytes:,} bytes (--index-bytes)"
    known = KNOWN_INDEXES.get(index_repo)
    if known is None:
        raise DeployError(f"no catalogue entry for the index repository {index_repo} "
                          f"(known: {', '.join(sorted(KNOWN_INDEXES))}): pass --index-bytes, the assembled index "
                          "file's size, to size the retriever's readiness budget")
    if known.kind != kind:
        raise DeployError(f"[launcher.retriever] kind = {kind!r} but {index_repo} is a {known.kind} index")
    return known.file_bytes, (f"{index_repo}: {known.kind}, {known.passages:,} × {known.dim} float32, "
                              f"{known.file_bytes:,} bytes")


def default_model_repo(model: str) -> str:
    """`Qwen/<name>` for a models/Qwen… directory (the Search-R1 configs), else an error asking for --model-repo."""
    name = Path(model).name
    if name.startswith("Qwen"):
        return f"Qwen/{name}"
    raise DeployError(f"cannot tell the Hub repository of {model}: pass --model-repo OWNER/NAME")


def _redis(template: dict[str, Any], need_bytes: int) -> tuple[dict[str, Any], int]:
    """Redis with maxmemory defaulting to `need_bytes` + 25 % (at least 4 GiB); returns it and the MB."""
    redis = copy.deepcopy(template)
    need_mb = max(4096, -(-need_bytes * 5 // 4 // 2**20))
    entry = redis["entrypoint"]
    redis["entrypoint"] = [*entry[:2], entry[2].replace("${REDIS_MAXMEMORY:-4gb}", f"${{REDIS_MAXMEMORY:-{need_mb}mb}}")]
    return redis, need_mb


def _learner(template: dict[str, Any], mount: str, plan: DeployPlan) -> dict[str, Any]:
    from searchr1.launcher.placement import LEARNER_SHM

    placed = plan.placed.learner
    lrn = _searchr1(template, mount, "learner")
    _place(lrn, placed)
    lrn["environment"].update(plan.learner_env())
    lrn["entrypoint"] = [*placed.command_prefix, "-m", "searchr1.cli"]
    # torchrun reads every option-like word of the line, and `--run` is ambiguous to it (--run-path):
    # the run's name goes through the environment instead
    command = _with_run_config(lrn["command"], plan.run)
    if "--run" in command:
        at = command.index("--run")
        del command[at:at + 2]
    lrn["command"] = command
    lrn["environment"]["LEARNER_REDIS__RUN"] = plan.run
    lrn["depends_on"] = {**AFTER_DATA, **AFTER_REDIS, "learner-check": {"condition": "service_completed_successfully"}}
    lrn["healthcheck"] = {**lrn["healthcheck"], "start_period": f"{int(plan.launch.learner.health_timeout_s)}s"}
    lrn["stop_grace_period"] = f"{plan.stop_grace_s}s"
    if len(placed.gpus) > 1:
        lrn["shm_size"] = LEARNER_SHM.replace("Gi", "gb")  # NCCL's shared-memory transport
    return lrn


def _learner_check(template: dict[str, Any], mount: str, learner: dict[str, Any]) -> dict[str, Any]:
    """`searchr1 train --check` with exactly the learner's config and environment, once, before it (not
    after the data step: a run its Redis cannot hold is refused before hours of downloads)."""
    check = _searchr1(template, mount)
    check.update(restart="no", environment=dict(learner["environment"]), command=[*learner["command"], "--check"],
                 depends_on=dict(AFTER_REDIS))
    return check


def _retriever(template: dict[str, Any], mount: str, plan: DeployPlan, index_dir: str, budget_s: int) -> dict[str, Any]:
    retriever = _searchr1(template, mount)
    _place(retriever, plan.placed.retriever)
    retriever["command"] = ["serve", "retriever", "--index", index_dir, "--host", "0.0.0.0", "--grpc-port",
                            "50051", "--http-port", "8000", "--config", CONFIG_IN_CONTAINER]
    retriever["healthcheck"] = {**retriever["healthcheck"], "interval": "30s", "retries": 10,
                                "start_period": f"{budget_s}s"}
    retriever["depends_on"] = AFTER_DATA
    return retriever


def trainers(services: dict[str, Any]) -> list[str]:
    """The services that train: `searchr1 train` without `--check`."""
    return [n for n, s in services.items() if (s.get("command") or [""])[0] == "train" and "--check" not in s["command"]]


def _index_dir(plan: DeployPlan) -> str:
    index_dir = plan.launch.retriever.index_dir
    if index_dir is None:
        raise DeployError(f"{plan.source}: [launcher.retriever] index_dir is not set (the index the retriever serves)")
    if Path(index_dir).name != "index":
        raise DeployError(f"{plan.source}: [launcher.retriever] index_dir = {index_dir!r}, but the data step imports "
                          "the fetched index into <directory>/index (`searchr1 index fetch --out <directory>`): end it "
                          "in /index")
    return str(index_dir)


def compose_project(plan: DeployPlan, base: dict[str, Any], options: ComposeOptions | None = None) -> str:
    """The compose project (YAML text) for `plan`, built from docker-compose.yml `base`."""
    from searchr1.learner.redis_budget import redis_need_bytes
    from searchr1.retriever.fetch import INDEX_REPO, KNOWN_INDEXES

    o = options or ComposeOptions()
    index_dir = _index_dir(plan)
    index_repo = o.index_repo or INDEX_REPO
    size, sized_from = index_size(index_repo, plan.launch.retriever.kind or "flat", o.index_bytes)
    encoder_repo = o.encoder_repo or (KNOWN_INDEXES[index_repo].encoder if index_repo in KNOWN_INDEXES else None)
    if encoder_repo is None:
        raise DeployError(f"pass --encoder-repo: the Hub repository of the encoder whose vectors {index_repo} holds")
    model_repo = o.model_repo or default_model_repo(plan.learner.model.path)
    budget = readiness_budget_s(size, plan.launch.retriever.health_timeout_s)
    mount = plan.source if Path(plan.source).is_absolute() else f"./{plan.source}"
    src, run = base["services"], plan.run
    services: dict[str, Any] = {}
    services["redis"], need_mb = _redis(src["redis"], redis_need_bytes(plan.learner))
    data = _searchr1(src["init"], mount)
    data.update(restart="no", depends_on={}, environment=data_env(index_repo), command=[data_script(
        plan.learner.dispatcher.dataset, plan.learner.model.path, model_repo, index_dir, o.encoder_dir, encoder_repo)])
    services["data"] = data
    services["retriever"] = _retriever(src["retriever"], mount, plan, index_dir, budget)
    reward = _searchr1(src["reward"], mount)
    reward.update(command=_with_run_config(reward["command"], run), depends_on=AFTER_DATA)
    services["reward"] = reward
    rollout_deps = {**AFTER_DATA, **AFTER_REDIS, "retriever": {"condition": "service_healthy"},
                    "reward": {"condition": "service_healthy"}}
    for i, worker in enumerate(plan.placed.rollout):
        s = _searchr1(src["rollout"], mount, "rollout")
        s["environment"].pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM on CPU only
        _place(s, worker)
        s.update(command=_with_run_config(s["command"], run), depends_on=rollout_deps,
                 healthcheck={**s["healthcheck"], "start_period": f"{int(plan.launch.rollout.health_timeout_s)}s"})
        services[f"rollout-gpu-{i}"] = s
    services["learner-gpus"] = _learner(src["learner"], mount, plan)
    services["learner-check"] = _learner_check(src["learner-check"], mount, services["learner-gpus"])
    for name in ("prometheus", "alertmanager", "grafana"):
        services[name] = copy.deepcopy(src[name])
    for small in (plan.placed.reward, plan.placed.redis):  # placed only when the placement lists cores
        if small is not None and small.cores is not None:
            services[small.name]["cpuset"] = small.cores.cpuset
    if trainers(services) != ["learner-gpus"]:  # one learner per project
        raise AssertionError(f"the project trains in {trainers(services)}")
    project: dict[str, Any] = {} if o.compose_v1 else {"name": plan.project}
    project.update(services=services, volumes={k: None for k in VOLUMES})
    head = _header(plan, budget, sized_from, need_mb, o)
    body = yaml.dump(project, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=110)
    return "\n".join(head) + body.replace(": null\n", ": {}\n")


def _plan_lines(plan: DeployPlan) -> list[str]:
    placed, settings = plan.placed, plan.settings
    by_gpu: dict[int, str] = {}
    for i, w in enumerate(placed.rollout):
        for g in w.gpus:
            by_gpu[g] = f"rollout-gpu-{i} (vLLM, tensor parallel {len(w.gpus)})"
    for rank, g in enumerate(placed.learner.gpus):
        by_gpu[g] = (by_gpu[g] + " + " if g in by_gpu else "") + f"learner-gpus rank {rank} (FSDP)"
    for g in placed.retriever.gpus:
        what = "query encoder + FAISS" if settings.retriever.faiss_gpu else "query encoder; FAISS on CPU"
        by_gpu[g] = (by_gpu[g] + " + " if g in by_gpu else "") + f"retriever ({what})"
    idle = [g for g in range(settings.gpus) if g not in by_gpu]
    lines = [f"#   GPU {g}: {by_gpu[g]}" for g in sorted(by_gpu)]
    lines += [f"#   GPU {g}: idle (no role in [placement]; give it to a role there and regenerate)" for g in idle]
    return lines


def _header(plan: DeployPlan, budget: int, sized_from: str, need_mb: int, o: ComposeOptions) -> list[str]:
    from searchr1.learner.stop_budget import ASSUMED_FLOPS, WRITE_BYTES_PER_S

    dc = f"docker-compose -p {plan.project}" if o.compose_v1 else "docker compose"
    f = "-f docker-compose.gpu.yml"
    faiss = (["# FAISS on the retriever's GPU: the image needs faiss-gpu (Dockerfile.cuda, --build-arg FAISS=gpu)."]
             if plan.settings.retriever.faiss_gpu else [])
    grace = plan.grace
    assumed = ("" if grace.measured_step else f" at {ASSUMED_FLOPS / 1e12:.0f} TFLOP/s per GPU")
    return [f"# Generated from {plan.source} by",
            f"#   searchr1 deploy compose {plan.source}{' --compose-v1' if o.compose_v1 else ''} "
            "--out docker-compose.gpu.yml",
            f"# Project {plan.project!r} (its own containers, network and volumes); secrets in .env, as docker-compose.yml.",
            f"# Use: {dc} {f} up -d data          # the data step alone first (hours)",
            f"#      {dc} {f} logs -f data",
            f"#      {dc} {f} up -d               # then the rest (the data step skips what is done)",
            f"# Run {plan.run!r}; every searchr1 service reads {plan.source} as /app/{CONFIG_IN_CONTAINER}.",
            "# GPUs:", *_plan_lines(plan), *faiss,
            f"# Retriever readiness budget: {budget} s, the larger of launcher.retriever.health_timeout_s and the",
            f"#   index read at {SLOW_READ_BYTES_PER_S / 1e6:.0f} MB/s + {START_OVERHEAD_S:.0f} s; the index the data "
            "step fetches:", f"#   {sized_from}.",
            f"# Redis maxmemory default: {need_mb} MB (what the learner keeps unacked, +25 %; REDIS_MAXMEMORY);",
            "#   learner-check refuses less than the learner keeps unacked, before it starts (logs learner-check).",
            f"# Learner stop grace: {plan.shutdown_timeout_s} s for torchrun's ranks (TORCH_ELASTIC_SHUTDOWN_TIMEOUT), "
            f"{plan.stop_grace_s} s for the container:",
            f"#   {grace.explain()}{assumed}, writes at {WRITE_BYTES_PER_S / 1e6:.0f} MB/s.", ""]
