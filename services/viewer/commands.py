"""`searchr1 view RUN_DIR`: serve the trajectory viewer of a run (registered by `searchr1.cli`).

Typer and `searchr1.core.commandline` at import time; the viewer's app and settings load inside the command.
Help texts of settings-backed flags are the `ViewerSettings` fields' docstrings.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from searchr1.core.commandline import fail, field_help, settings_or_exit, token_or_exit

if TYPE_CHECKING:
    from searchr1.cli import Groups
    from searchr1.viewer.settings import ViewerSettings

VIEWER_SETTINGS = "searchr1.viewer.settings:ViewerSettings"


def _session_token(settings: ViewerSettings) -> tuple[ViewerSettings, bool]:
    """`settings` with a token: its own; none with `auth.insecure_no_auth` (after the WARNING); else one
    generated for this session. Returns (settings, whether the token was generated)."""
    import secrets

    if settings.token or settings.auth.insecure_no_auth:
        token_or_exit(settings.token, settings.auth, server="the viewer", setting="VIEWER_TOKEN (--token)")
        return settings, False
    return settings.model_copy(update={"token": secrets.token_urlsafe(18)}), True


def view(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (holding archive/) or an archive directory.")],
    host: Annotated[str | None, typer.Option(help=field_help(VIEWER_SETTINGS, "host"))] = None,
    port: Annotated[int | None, typer.Option(help=field_help(VIEWER_SETTINGS, "port"))] = None,
    token: Annotated[str | None, typer.Option(envvar="VIEWER_TOKEN", help=field_help(VIEWER_SETTINGS, "token"))]
    = None,
    compare: Annotated[Path | None, typer.Option(help=field_help(VIEWER_SETTINGS, "compare"))] = None,
    tokenizer: Annotated[Path | None, typer.Option(help=field_help(VIEWER_SETTINGS, "tokenizer"))] = None,
    step_log: Annotated[Path | None, typer.Option(help="Learner JSONL step log (default: the newest "
                                                       "RUN_DIR/learner/*.jsonl).")] = None,
    config: Annotated[Path | None, typer.Option(help="Run config (TOML/YAML) with a viewer table; VIEWER_* "
                                                     "environment variables and the flags override it.")] = None,
    insecure_no_auth: Annotated[bool | None, typer.Option(
        "--insecure-no-auth", help="Serve the pages without a token (anyone who reaches the port reads "
                                   "every prompt and response). Without it and without --token, a "
                                   "token is generated for the session.")] = None,
) -> None:
    """Browse a run's trajectory archive in a web browser: curves and collapse signals per step, filters,
    every trajectory turn by turn with its loss mask, every question across steps. Works on a live run."""
    import asyncio

    from searchr1.core.servers import HttpServer, install_shutdown_signals
    from searchr1.core.supervise import Supervisor, TaskDied
    from searchr1.viewer.app import TokenizerError, create_app
    from searchr1.viewer.settings import ViewerSettings
    from searchr1.viewer.store import ArchiveNotFound

    settings = settings_or_exit(ViewerSettings, config, host=host, port=port, token=token, compare=compare,
                                tokenizer=tokenizer, auth__insecure_no_auth=insecure_no_auth)
    settings, generated = _session_token(settings)
    try:
        app = create_app(run_dir, settings, step_log)
    except (ArchiveNotFound, TokenizerError) as exc:
        fail(str(exc))

    async def _serve() -> None:
        server = HttpServer(app, settings.host, settings.port)
        await server.start()
        typer.echo(f"searchr1 viewer of {run_dir} on {server.url}" + (
            f"/?token={settings.token}" if generated else "/?token=…" if settings.token else ""))
        stop = asyncio.Event()
        install_shutdown_signals(stop)
        supervisor = Supervisor("viewer")
        supervisor.watch("http server", server.task)  # type: ignore[arg-type]  # started above
        try:
            await supervisor.wait(stop)
        finally:
            await supervisor.close()
            await server.stop()

    try:
        asyncio.run(_serve())
    except TaskDied as exc:  # the server stopped serving on its own
        fail(str(exc), 1)
    except OSError as exc:  # the port is taken, the address cannot be bound
        fail(f"cannot serve on {settings.host}:{settings.port}: {exc}", 1)


def register(groups: Groups) -> None:
    """Add `view` to the top-level CLI."""
    groups.app.command("view")(view)
