"""`searchr1 view RUN_DIR`: serve the trajectory viewer of a run (registered by `searchr1.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def _session_token(settings):
    """`settings` with a token: its own; none with `auth.insecure_no_auth` (after the WARNING); else one
    generated for this session. Returns (settings, whether the token was generated)."""
    import secrets

    from searchr1.core.commandline import token_or_exit

    if settings.token or settings.auth.insecure_no_auth:
        token_or_exit(settings.token, settings.auth, server="the viewer", setting="VIEWER_TOKEN (--token)")
        return settings, False
    return settings.model_copy(update={"token": secrets.token_urlsafe(18)}), True


def register(groups) -> None:
    @groups.app.command("view")
    def view(
        run_dir: Annotated[Path, typer.Argument(help="Run directory (holding archive/) or an archive directory.")],
        host: Annotated[str | None, typer.Option(help="Address to bind [default 127.0.0.1].")] = None,
        port: Annotated[int | None, typer.Option(help="Port [default 8600; 0 = any free port].")] = None,
        token: Annotated[str | None, typer.Option(envvar="VIEWER_TOKEN",
                                                  help="Bearer token the pages need; open in a browser with "
                                                       "?token=… once.")] = None,
        compare: Annotated[Path | None, typer.Option(help="A second run to show beside this one on question "
                                                          "pages (before/after).")] = None,
        tokenizer: Annotated[Path | None, typer.Option(help="tokenizer.json (or its directory) to decode tokens.")] = None,
        step_log: Annotated[Path | None, typer.Option(help="Learner JSONL step log [default: newest "
                                                           "RUN_DIR/learner/*.jsonl].")] = None,
        config: Annotated[Path | None, typer.Option(help="Run config with a [viewer] table.")] = None,
        insecure_no_auth: Annotated[bool | None, typer.Option(
            "--insecure-no-auth", help="Serve the pages without a token (anyone who reaches the port reads "
                                       "every prompt and response). Without it and without --token, a "
                                       "token is generated for the session.")] = None,
    ) -> None:
        """Browse a run's trajectory archive in a web browser: curves and collapse signals per step, filters,
        every trajectory turn by turn with its loss mask, every question across steps. Works on a live run."""
        import asyncio

        from searchr1.core.servers import HttpServer, install_shutdown_signals
        from searchr1.core.settings import load_settings
        from searchr1.viewer.app import create_app
        from searchr1.viewer.settings import ViewerSettings
        from searchr1.viewer.store import ArchiveNotFound

        settings = load_settings(ViewerSettings, config, host=host, port=port, token=token, compare=compare,
                                 tokenizer=tokenizer, auth__insecure_no_auth=insecure_no_auth)
        settings, generated = _session_token(settings)
        try:
            app = create_app(run_dir, settings, step_log)
        except ArchiveNotFound as exc:
            raise typer.BadParameter(str(exc), param_hint="RUN_DIR") from None

        async def _serve() -> None:
            server = HttpServer(app, settings.host, settings.port)
            await server.start()
            typer.echo(f"searchr1 viewer of {run_dir} on {server.url}" + (
                f"/?token={settings.token}" if generated else "/?token=…" if settings.token else ""))
            stop = asyncio.Event()
            install_shutdown_signals(stop)
            await stop.wait()
            await server.stop()

        asyncio.run(_serve())
