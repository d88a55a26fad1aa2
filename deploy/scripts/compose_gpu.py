"""docker-compose.gpu.yml: a complete compose project that runs one run config on one GPU node.

    python deploy/scripts/compose_gpu.py configs/searchr1-3b-grpo.toml > docker-compose.gpu.yml
    docker compose -f docker-compose.gpu.yml up -d

From the config's `[placement]` table (the layout `searchr1 up` and the Kubernetes gpu overlay use) and
docker-compose.yml's services it writes:

- `data`, one shot, first: the inputs the config names onto the `inputs` and `models` volumes (train
  parquet by `searchr1 data fetch`, the policy and the retriever's encoder from the Hugging Face Hub or a
  local mirror mounted at /mirror, the index by `searchr1 index fetch` from `--index-repo`); each step is
  skipped when its output is there. Every other searchr1 service but `learner-check` waits for it
  (`service_completed_successfully`).
- `retriever` on the placement's GPU (query encoder on CUDA; FAISS too with `[placement.retriever]
  faiss_gpu`) or on CPU, its healthcheck's start period sized from the index the data step fetches: the
  catalogue's entry for `--index-repo` (`searchr1.retriever.fetch.KNOWN_INDEXES`), or `--index-bytes`.
- `rollout-gpu-0`, `-1`, … one per vLLM worker and `learner-gpus` (the learner's FSDP ranks under
  torchrun), each given exactly its GPUs by `device_ids`, with the network aliases Prometheus discovers;
  `learner-check`, one shot before the learner: `searchr1 train --check` with the learner's config and
  environment, so a run its Redis cannot hold stops there once instead of a learner restarted forever.
- redis (maxmemory sized by the run: `searchr1.learner.redis_budget`), reward, Prometheus, Alertmanager,
  Grafana as in docker-compose.yml.

Every searchr1 service mounts the config read-only at /app/configs/run.toml and reads it. There is no CPU
`rollout`/`learner` service, no tiny-world `init` and no profile in this project: one learner, always. A
config whose service tables contradict its placement is refused (`placement_conflicts`), as is one whose
index directory is not where the data step puts the fetched index. A GPU the placement leaves idle is
named in the header. GPU kernels compiled at first use (Triton, inductor, vLLM) land on the `cache` volume
and are reused by the next start.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG_IN_CONTAINER = "configs/run.toml"
IMAGE = "${SEARCHR1_GPU_IMAGE:-searchr1:gpu}"
SLOW_READ_BYTES_PER_S = 100e6
"""Read rate the retriever's readiness budget assumes (a network volume; local NVMe is 10-30× faster)."""
START_OVERHEAD_S = 300.0
"""Encoder load, corpus map, CUDA context and server start on top of reading the index."""
INPUT_MOUNTS = ["inputs:/app/data", "models:/app/models", "cache:/app/.cache"]


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


def _gpu(devices: tuple[int, ...]) -> dict[str, Any]:
    return {"resources": {"reservations": {"devices": [
        {"driver": "nvidia", "device_ids": [str(d) for d in devices], "capabilities": ["gpu"]}]}}}


def _with_run_config(argv: list[str], run: str) -> list[str]:
    """A service command reading the run config and naming the run."""
    out = [CONFIG_IN_CONTAINER if a == "configs/compose.toml" else a for a in argv]
    if "--run" in out:
        out[out.index("--run") + 1] = run
    return out


def _searchr1(template: dict[str, Any], config_mount: str, env: dict[str, str] | None = None,
              devices: tuple[int, ...] = (), alias: str | None = None) -> dict[str, Any]:
    s = copy.deepcopy(template)
    for key in ("profiles", "build", "deploy", "networks"):
        s.pop(key, None)
    s["image"] = IMAGE
    s["volumes"] = ["data:/app/runs", f"{config_mount}:/app/{CONFIG_IN_CONTAINER}:ro", *INPUT_MOUNTS]
    s["environment"] = {**s.get("environment", {}),
                        **{k: v for k, v in (env or {}).items() if k != "CUDA_VISIBLE_DEVICES"}}
    if alias:
        s["networks"] = {"default": {"aliases": [alias]}}
    if devices:
        s["deploy"] = _gpu(devices)
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


def _plan_lines(plan, settings, idle: list[int]) -> list[str]:
    by_gpu: dict[int, str] = {}
    for i, w in enumerate(plan.rollout):
        for g in w.gpus:
            by_gpu[g] = f"rollout-gpu-{i} (vLLM, tensor parallel {len(w.gpus)})"
    for rank, g in enumerate(plan.learner.gpus):
        by_gpu[g] = (by_gpu[g] + " + " if g in by_gpu else "") + f"learner-gpus rank {rank} (FSDP)"
    for g in plan.retriever.gpus:
        what = "query encoder + FAISS" if settings.retriever.faiss_gpu else "query encoder; FAISS on CPU"
        by_gpu[g] = (by_gpu[g] + " + " if g in by_gpu else "") + f"retriever ({what})"
    lines = [f"#   GPU {g}: {by_gpu[g]}" for g in sorted(by_gpu)]
    lines += [f"#   GPU {g}: idle (no role in [placement]; give it to a role there and regenerate)" for g in idle]
    return lines


def data_env(index_repo: str) -> dict[str, str]:
    """The data service's sources, each overridable from .env (a Hub mirror, a local dataset copy); the
    index repository defaults to the one the readiness budget was sized for."""
    from searchr1.retriever.fetch import CORPUS_REPO

    return {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "${HF_ENDPOINT:-https://huggingface.co}", "HF_TOKEN": "${HF_TOKEN:-}",
            "SEARCHR1_DATA_REPO": "${SEARCHR1_DATA_REPO:-RUC-NLPIR/FlashRAG_datasets}",
            "SEARCHR1_INDEX_REPO": f"${{SEARCHR1_INDEX_REPO:-{index_repo}}}",
            "SEARCHR1_CORPUS_REPO": f"${{SEARCHR1_CORPUS_REPO:-{CORPUS_REPO}}}"}


AFTER_DATA = {"data": {"condition": "service_completed_successfully"}}
AFTER_REDIS = {"redis": {"condition": "service_healthy"}}


def index_size(index_repo: str, kind: str, index_bytes: int | None = None) -> tuple[int, str]:
    """(bytes, how they were found) of the index the data step fetches from `index_repo`: `index_bytes`
    when given, else the catalogue's entry (`KNOWN_INDEXES`), whose kind must be the config's `kind`."""
    from searchr1.retriever.fetch import KNOWN_INDEXES

    if index_bytes is not None:
        return index_bytes, f"{index_repo}: {index_bytes:,} bytes (--index-bytes)"
    known = KNOWN_INDEXES.get(index_repo)
    if known is None:
        raise SystemExit(f"no catalogue entry for the index repository {index_repo} "
                         f"(known: {', '.join(sorted(KNOWN_INDEXES))}): pass --index-bytes, the assembled index "
                         "file's size, to size the retriever's readiness budget")
    if known.kind != kind:
        raise SystemExit(f"[launcher.retriever] kind = {kind!r} but {index_repo} is a {known.kind} index")
    return known.file_bytes, (f"{index_repo}: {known.kind}, {known.passages:,} × {known.dim} float32, "
                              f"{known.file_bytes:,} bytes")


def _redis(template: dict[str, Any], need_bytes: int) -> tuple[dict[str, Any], int]:
    """Redis with maxmemory defaulting to `need_bytes` + 25 % (at least 4 GiB); returns it and the MB."""
    redis = copy.deepcopy(template)
    need_mb = max(4096, -(-need_bytes * 5 // 4 // 2**20))
    entry = redis["entrypoint"]
    redis["entrypoint"] = [*entry[:2], entry[2].replace("${REDIS_MAXMEMORY:-4gb}", f"${{REDIS_MAXMEMORY:-{need_mb}mb}}")]
    return redis, need_mb


def _learner(template: dict[str, Any], mount: str, plan, run: str, start_s: float) -> dict[str, Any]:
    from searchr1.launcher.placement import LEARNER_SHM

    lrn = _searchr1(template, mount, plan.learner.env, plan.learner.gpus, "learner")
    lrn["entrypoint"] = [*plan.learner.command_prefix, "-m", "searchr1.cli"]
    # torchrun reads every option-like word of the line, and `--run` is ambiguous to it (--run-path):
    # the run's name goes through the environment instead
    command = _with_run_config(lrn["command"], run)
    if "--run" in command:
        at = command.index("--run")
        del command[at:at + 2]
    lrn["command"] = command
    lrn["environment"]["LEARNER_REDIS__RUN"] = run
    lrn["depends_on"] = {**AFTER_DATA, **AFTER_REDIS, "learner-check": {"condition": "service_completed_successfully"}}
    lrn["healthcheck"] = {**lrn["healthcheck"], "start_period": f"{int(start_s)}s"}
    if len(plan.learner.gpus) > 1:
        lrn["shm_size"] = LEARNER_SHM.replace("Gi", "gb")  # NCCL's shared-memory transport
    return lrn


def _learner_check(template: dict[str, Any], mount: str, learner: dict[str, Any]) -> dict[str, Any]:
    """`searchr1 train --check` with exactly the learner's config and environment, once, before it (not
    after the data step: a run its Redis cannot hold is refused before hours of downloads)."""
    check = _searchr1(template, mount)
    check.update(restart="no", environment=dict(learner["environment"]), command=[*learner["command"], "--check"],
                 depends_on=dict(AFTER_REDIS))
    return check


def _retriever(template: dict[str, Any], mount: str, plan, index_dir: str, budget_s: int) -> dict[str, Any]:
    retriever = _searchr1(template, mount, plan.retriever.env, plan.retriever.gpus)
    retriever["command"] = ["serve", "retriever", "--index", index_dir, "--host", "0.0.0.0", "--grpc-port",
                            "50051", "--http-port", "8000", "--config", CONFIG_IN_CONTAINER]
    retriever["healthcheck"] = {**retriever["healthcheck"], "interval": "30s", "retries": 10,
                                "start_period": f"{budget_s}s"}
    retriever["depends_on"] = AFTER_DATA
    return retriever


COMPOSE_NAMES = {"learner": "learner-gpus", "retriever": "retriever", "reward": "reward", "redis": "redis"}
"""The compose service of each placed process (rollout-i runs as rollout-gpu-i)."""


def pin_cores(services: dict[str, Any], plan) -> None:
    """Each placed process's `cpuset` (the placement's cores; `placement_cpu_resources`) on its service."""
    from searchr1.launcher.cpu_placement import placement_cpu_resources

    for name, res in placement_cpu_resources(plan).items():
        service = COMPOSE_NAMES.get(name) or name.replace("rollout-", "rollout-gpu-")
        services[service]["cpuset"] = res["cpuset"]


def trainers(services: dict[str, Any]) -> list[str]:
    """The services that train: `searchr1 train` without `--check`."""
    return [n for n, s in services.items() if (s.get("command") or [""])[0] == "train" and "--check" not in s["command"]]


def _checked(config: Path, settings, launch) -> tuple[Any, str]:
    """(the placement plan, the index directory) of a config the generated project can run; else SystemExit
    naming what to change."""
    from searchr1.core.settings import read_config_file
    from searchr1.launcher.placement import placement_conflicts, plan_placement

    plan = plan_placement(settings)
    if not plan.places_gpus:
        raise SystemExit(f"{config}: [placement] lists no GPUs; this generator writes a GPU node's project")
    conflicts = placement_conflicts(read_config_file(config), plan)
    if conflicts:
        raise SystemExit(f"{config}: " + "; ".join(conflicts))
    index_dir = launch.retriever.index_dir
    if index_dir is None:
        raise SystemExit(f"{config}: [launcher.retriever] index_dir is not set (the index the retriever serves)")
    if Path(index_dir).name != "index":
        raise SystemExit(f"{config}: [launcher.retriever] index_dir = {index_dir!r}, but the data step imports the "
                         "fetched index into <directory>/index (`searchr1 index fetch --out <directory>`): end it in /index")
    return plan, str(index_dir)


def compose_gpu(config: Path, settings, learner, base: dict[str, Any], *, model_repo: str,
                encoder_repo: str | None = None, encoder_dir: str = "models/e5-base-v2",
                index_repo: str | None = None, index_bytes: int | None = None, source: str = "") -> str:
    """The compose project (YAML text) for the run config at `config` whose [placement] is `settings`
    (PlacementSettings) and whose learner settings are `learner`, built from docker-compose.yml `base`.
    `index_repo` (default: Search-R1's wiki-18 e5 index) is what the data step fetches; `index_bytes` its
    size when the catalogue has no entry for it; `encoder_repo` defaults to the catalogue's encoder."""
    from searchr1.core.settings import load_settings
    from searchr1.launcher.settings import LauncherSettings
    from searchr1.learner.redis_budget import redis_need_bytes
    from searchr1.retriever.fetch import INDEX_REPO, KNOWN_INDEXES

    launch = load_settings(LauncherSettings, config)
    plan, index_dir = _checked(config, settings, launch)
    index_repo = index_repo or INDEX_REPO
    size, sized_from = index_size(index_repo, launch.retriever.kind or "flat", index_bytes)
    encoder_repo = encoder_repo or (KNOWN_INDEXES[index_repo].encoder if index_repo in KNOWN_INDEXES else None)
    if encoder_repo is None:
        raise SystemExit(f"pass --encoder-repo: the Hub repository of the encoder whose vectors {index_repo} holds")
    budget = readiness_budget_s(size, launch.retriever.health_timeout_s)
    mount = str(config) if config.is_absolute() else f"./{config}"
    src, run = base["services"], launch.run
    services: dict[str, Any] = {}
    services["redis"], need_mb = _redis(src["redis"], redis_need_bytes(learner))
    data = _searchr1(src["init"], mount)
    data.update(restart="no", depends_on={}, environment=data_env(index_repo), command=[data_script(
        learner.dispatcher.dataset, learner.model.path, model_repo, index_dir, encoder_dir, encoder_repo)])
    services["data"] = data
    services["retriever"] = _retriever(src["retriever"], mount, plan, index_dir, budget)
    reward = _searchr1(src["reward"], mount)
    reward.update(command=_with_run_config(reward["command"], run), depends_on=AFTER_DATA)
    services["reward"] = reward
    rollout_deps = {**AFTER_DATA, **AFTER_REDIS, "retriever": {"condition": "service_healthy"},
                    "reward": {"condition": "service_healthy"}}
    for i, worker in enumerate(plan.rollout):
        s = _searchr1(src["rollout"], mount, worker.env, worker.gpus, "rollout")
        s["environment"].pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM on CPU only
        s.update(command=_with_run_config(s["command"], run), depends_on=rollout_deps,
                 healthcheck={**s["healthcheck"], "start_period": f"{int(launch.rollout.health_timeout_s)}s"})
        services[f"rollout-gpu-{i}"] = s
    services["learner-gpus"] = _learner(src["learner"], mount, plan, run, launch.learner.health_timeout_s)
    services["learner-check"] = _learner_check(src["learner-check"], mount, services["learner-gpus"])
    for name in ("prometheus", "alertmanager", "grafana"):
        services[name] = copy.deepcopy(src[name])
    pin_cores(services, plan)
    assert trainers(services) == ["learner-gpus"], trainers(services)  # one learner per project
    head = _header(source or str(config), run, plan, settings, budget, sized_from, need_mb)
    volumes = {k: None for k in ("data", "inputs", "models", "cache", "redis", "prometheus", "alertmanager")}
    body = yaml.dump({"services": services, "volumes": volumes}, Dumper=_Dumper, sort_keys=False,
                     default_flow_style=False, width=110)
    return "\n".join(head) + body.replace(": null\n", ": {}\n")


def _header(source: str, run: str, plan, settings, budget: int, sized_from: str, need_mb: int) -> list[str]:
    used = {*(g for w in plan.rollout for g in w.gpus), *plan.learner.gpus, *plan.retriever.gpus}
    idle = [g for g in range(settings.gpus) if g not in used]
    faiss = (["# FAISS on the retriever's GPU: the image needs faiss-gpu (Dockerfile.cuda, --build-arg FAISS=gpu)."]
             if settings.retriever.faiss_gpu else [])
    return [f"# Generated from {source} by",
            f"#   python deploy/scripts/compose_gpu.py {source} > docker-compose.gpu.yml",
            "# Use: docker compose -f docker-compose.gpu.yml up -d    (secrets in .env, as docker-compose.yml)",
            f"# Run {run!r}; every searchr1 service reads {source} as /app/{CONFIG_IN_CONTAINER}.",
            "# GPUs:", *_plan_lines(plan, settings, idle), *faiss,
            f"# Retriever readiness budget: {budget} s, the larger of launcher.retriever.health_timeout_s and the",
            f"#   index read at {SLOW_READ_BYTES_PER_S / 1e6:.0f} MB/s + {START_OVERHEAD_S:.0f} s; the index the data "
            "step fetches:", f"#   {sized_from}.",
            f"# Redis maxmemory default: {need_mb} MB (what the learner keeps unacked, +25 %; REDIS_MAXMEMORY);",
            "#   learner-check refuses less than the learner keeps unacked, before it starts (logs learner-check).", ""]


def default_model_repo(model: str) -> str:
    """`Qwen/<name>` for a models/Qwen… directory (the Search-R1 configs), else an error asking for --model-repo."""
    name = Path(model).name
    if name.startswith("Qwen"):
        return f"Qwen/{name}"
    raise SystemExit(f"cannot tell the Hub repository of {model}: pass --model-repo OWNER/NAME")


def main(argv: list[str]) -> None:
    from searchr1.core.settings import load_settings
    from searchr1.launcher.placement import PlacementSettings
    from searchr1.learner.settings import LearnerSettings
    from searchr1.retriever.fetch import INDEX_REPO

    p = argparse.ArgumentParser(description="docker-compose.gpu.yml for a run config with a [placement] table")
    p.add_argument("config", type=Path)
    p.add_argument("--model-repo", help="Hub repository of the policy (default: Qwen/<model directory name>)")
    p.add_argument("--index-repo", default=INDEX_REPO, help="Hub dataset the data step fetches the index from")
    p.add_argument("--index-bytes", type=int, help="Size of that index file, for an index the catalogue does not "
                   "know (searchr1.retriever.fetch.KNOWN_INDEXES): sizes the retriever's readiness budget")
    p.add_argument("--encoder-repo", help="Hub repository of the index's encoder (default: the catalogue's)")
    p.add_argument("--encoder-dir", default="models/e5-base-v2", help="Where the data service puts the encoder")
    a = p.parse_args(argv)
    learner = load_settings(LearnerSettings, a.config)
    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    sys.stdout.write(compose_gpu(a.config, load_settings(PlacementSettings, a.config), learner, base,
                                 model_repo=a.model_repo or default_model_repo(learner.model.path),
                                 encoder_repo=a.encoder_repo, encoder_dir=a.encoder_dir, index_repo=a.index_repo,
                                 index_bytes=a.index_bytes, source=str(a.config)))


if __name__ == "__main__":
    main(sys.argv[1:])
