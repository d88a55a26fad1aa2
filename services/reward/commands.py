"""CLI commands of the reward service, registered into `searchr1` by `searchr1.cli`.

Keep this module light: Typer at import time only; heavy imports go inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from searchr1.cli import Groups


def register(groups: Groups) -> None:
    """Add this service's commands to the CLI groups."""

    @groups.serve.command("reward")
    def serve_reward(
        host: Annotated[str | None, typer.Option(help="Address to listen on (default from config/env).")] = None,
        port: Annotated[int | None, typer.Option(min=0, max=65535, help="HTTP port (0 = any free port).")] = None,
        config: Annotated[Path | None, typer.Option("--config", "-c", help="Run config (TOML/YAML), its "
                                                        "reward table.")] = None,
    ) -> None:
        """Serve the reward service: POST /v1/score, GET /v1/scorers, /healthz and /metrics on one port."""
        import asyncio

        from searchr1.core.settings import ConfigError, load_settings
        from searchr1.reward.app import serve
        from searchr1.reward.settings import RewardSettings

        try:
            settings = load_settings(RewardSettings, config, host=host, port=port)
        except (ConfigError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        try:
            asyncio.run(serve(settings))
        except OSError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
