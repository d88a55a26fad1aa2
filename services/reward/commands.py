"""CLI commands of the reward service, registered into `searchr1` by `searchr1.cli`: `searchr1 serve reward`.

The command parses its flags, loads `RewardSettings` through the one validated override path and calls
`app.run`. Keep this module light: heavy imports happen inside the run function.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from searchr1.core.commandline import INSECURE_HELP, field_help, settings_or_exit, token_or_exit

if TYPE_CHECKING:
    from searchr1.cli import Groups

REWARD_SETTINGS = "searchr1.reward.settings:RewardSettings"


def serve_reward(
    host: Annotated[str | None, typer.Option(help=field_help(REWARD_SETTINGS, "host"))] = None,
    port: Annotated[int | None, typer.Option(min=0, max=65535, help=field_help(REWARD_SETTINGS, "port"))] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Run config (TOML/YAML), its "
                                                    "reward table.")] = None,
    insecure_no_auth: Annotated[bool | None, typer.Option("--insecure-no-auth", help=INSECURE_HELP)] = None,
) -> None:
    """Serve the reward service: POST /v1/score, GET /v1/scorers, /healthz and /metrics on one port."""
    from searchr1.reward.settings import RewardSettings


    settings = settings_or_exit(RewardSettings, config, host=host, port=port,
                                auth__insecure_no_auth=insecure_no_auth)
    token_or_exit(settings.token, settings.auth, server="the reward service", setting="REWARD_TOKEN ([reward] token)")
    from searchr1.reward.app import run

    raise typer.Exit(run(settings))


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""
    groups.serve.command("reward")(serve_reward)
