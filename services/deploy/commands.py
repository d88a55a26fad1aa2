"""CLI commands of deployment generation, registered into `searchr1` by `searchr1.cli`: `searchr1 deploy
compose CONFIG` (the compose project for one GPU node) and `searchr1 deploy k8s CONFIG` (the Kubernetes
placement patch), each to stdout or `--out FILE` (written only when the whole file is). A config the files
could not run is refused with one line on stderr and exit 2.

Keep this module light: Typer at import time only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from searchr1.core.commandline import fail

if TYPE_CHECKING:
    from searchr1.cli import Groups

ConfigArg = Annotated[Path, typer.Argument(help="Run config (TOML/YAML) with a placement table.")]
OutOption = Annotated[Path | None, typer.Option(
    "--out", "-o", help="Write the file here (replaced only once complete); default: stdout.")]
StepOption = Annotated[float | None, typer.Option(
    "--learner-step-s", min=1.0, help="A measured learner step time in seconds (searchr1_learner_step_seconds): "
    "sizes the learner's stop grace instead of the estimate from the config's shape.")]


def register(groups: Groups) -> None:
    """Add the `deploy` commands to the CLI groups."""
    groups.deploy.command("compose")(compose)
    groups.deploy.command("k8s")(k8s)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
        return
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(out)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    typer.echo(f"wrote {out}", err=True)


def _plan(config: Path, step_s: float | None):
    from searchr1.deploy import DeployError
    from searchr1.deploy.plan import deploy_plan

    try:
        return deploy_plan(config, source=str(config), step_s=step_s)
    except DeployError as exc:
        fail(str(exc))


def compose(
    config: ConfigArg,
    out: OutOption = None,
    base: Annotated[Path, typer.Option(help="The tiny world's compose file the services are taken from (run from "
                                            "the repository root: the project mounts its deploy/ files).")]
        = Path("docker-compose.yml"),
    model_repo: Annotated[str | None, typer.Option(help="Hub repository of the policy (default: Qwen/<model "
                                                        "directory name>).")] = None,
    index_repo: Annotated[str | None, typer.Option(help="Hub dataset the data step fetches the index from "
                                                        "(default: Search-R1's wiki-18 e5 index).")] = None,
    index_bytes: Annotated[int | None, typer.Option(min=1, help="Size of that index file, for an index the "
                                                    "catalogue does not know: sizes the retriever's readiness "
                                                    "budget.")] = None,
    encoder_repo: Annotated[str | None, typer.Option(help="Hub repository of the index's encoder (default: the "
                                                          "catalogue's).")] = None,
    encoder_dir: Annotated[str, typer.Option(help="Where the data step puts the encoder.")] = "models/e5-base-v2",
    learner_step_s: StepOption = None,
    compose_v1: Annotated[bool, typer.Option("--compose-v1", help="Leave out the project's top-level name: "
                                             "(docker-compose v1.29 refuses it); name the project with -p then.")]
        = False,
) -> None:
    """Write the compose project that runs CONFIG on one GPU node (docs/deploy.md).

    The data step, the retriever, one vLLM worker per rollout group and the learner under torchrun on the
    GPUs the config's placement table gives them, Redis sized by the run, the monitoring stack."""
    import yaml

    from searchr1.deploy import DeployError
    from searchr1.deploy.compose import ComposeOptions, compose_project

    plan = _plan(config, learner_step_s)
    try:
        services = yaml.safe_load(base.read_text())
    except OSError as exc:
        fail(f"cannot read the base compose file {base} ({exc.strerror or exc}): run from the repository root or "
             "pass --base")
    except yaml.YAMLError as exc:
        fail(f"{base} is not YAML: {' '.join(str(exc).split())}")
    options = ComposeOptions(model_repo=model_repo, index_repo=index_repo, index_bytes=index_bytes,
                             encoder_repo=encoder_repo, encoder_dir=encoder_dir, compose_v1=compose_v1)
    try:
        text = compose_project(plan, services, options)
    except DeployError as exc:
        fail(str(exc))
    except (KeyError, TypeError) as exc:
        fail(f"{base} lacks what the project is built from (docker-compose.yml's services): {exc}")
    _write(text, out)


def k8s(config: ConfigArg, out: OutOption = None, learner_step_s: StepOption = None) -> None:
    """Write the kustomize patch that places CONFIG's processes on a GPU cluster (docs/deploy.md).

    GPUs per rollout worker and learner rank, the learner's torchrun and stop grace, the retriever's GPU:
    the gpu overlays' placement.yaml."""
    from searchr1.deploy.k8s import k8s_placement_patch

    _write(k8s_placement_patch(_plan(config, learner_step_s)), out)
