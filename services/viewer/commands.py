"""`searchr1 view RUN_DIR`: serve the trajectory viewer of a run (registered by `searchr1.cli`); with
`--model` (and `--index` or `--retriever`) its ask page puts questions to that policy.

Typer and `searchr1.core.commandline` at import time; the viewer's app and settings load inside the command.
Help texts of settings-backed flags are the `ViewerSettings` fields' docstrings. The asker comes from the
CLI's composition root (`searchr1.cli.CliDeps.open_asker` in the Typer context's `obj`): this package imports
no engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from searchr1.core.commandline import fail, field_help, model_dir_or_exit, settings_or_exit, token_or_exit

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
    ctx: typer.Context,
    run_dir: Annotated[Path | None, typer.Argument(
        help="Run directory (holding archive/) or an archive directory; optional with --model (the ask page "
             "only).")] = None,
    host: Annotated[str | None, typer.Option(help=field_help(VIEWER_SETTINGS, "host"))] = None,
    port: Annotated[int | None, typer.Option(help=field_help(VIEWER_SETTINGS, "port"))] = None,
    token: Annotated[str | None, typer.Option(envvar="VIEWER_TOKEN", help=field_help(VIEWER_SETTINGS, "token"))]
    = None,
    compare: Annotated[Path | None, typer.Option(help=field_help(VIEWER_SETTINGS, "compare"))] = None,
    tokenizer: Annotated[Path | None, typer.Option(help=field_help(VIEWER_SETTINGS, "tokenizer"))] = None,
    step_log: Annotated[Path | None, typer.Option(help="Learner JSONL step log (default: the newest "
                                                       "RUN_DIR/learner/*.jsonl).")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Run config (TOML/YAML) with a viewer table (and, for --model, its rollout table: "
                               "engine and agent limits); VIEWER_* environment variables and the flags override it.")]
    = None,
    insecure_no_auth: Annotated[bool | None, typer.Option(
        "--insecure-no-auth", help="Serve the pages without a token (anyone who reaches the port reads "
                                   "every prompt and response). Without it and without --token, a "
                                   "token is generated for the session.")] = None,
    model: Annotated[Path | None, typer.Option(
        "--model", "-m", help="A policy (model directory) to ask questions on the /ask page.")] = None,
    index: Annotated[Path | None, typer.Option(
        "--index", help="With --model: an index directory to serve in this process for the policy's searches.")]
    = None,
    retriever: Annotated[list[str] | None, typer.Option(
        "--retriever", help="With --model: a running retriever (host:port, or a Search-R1 /retrieve URL).")] = None,
    engine: Annotated[str | None, typer.Option(
        help="With --model: the generation engine, vllm or hf (default: the run config's rollout.engine.kind).")]
    = None,
) -> None:
    """Browse a run's trajectory archive in a web browser: curves and collapse signals per step, filters,
    every trajectory turn by turn with its loss mask, every question across steps. Works on a live run.
    With --model, the ask page puts your questions to that policy (greedy, through the agent loop)."""
    import asyncio

    from searchr1.core.supervise import TaskDied
    from searchr1.viewer.app import TokenizerError, create_app
    from searchr1.viewer.settings import ViewerSettings
    from searchr1.viewer.store import ArchiveNotFound

    settings = settings_or_exit(ViewerSettings, config, host=host, port=port, token=token, compare=compare,
                                tokenizer=tokenizer, auth__insecure_no_auth=insecure_no_auth)
    settings, generated = _session_token(settings)
    if run_dir is None and model is None:
        fail("give a run directory (RUN_DIR), or --model to ask a policy")
    ask = _ask_options(ctx, model, index, retriever, config, engine)
    try:
        if run_dir is not None:
            create_app(run_dir, settings, step_log)  # refuse a bad run directory before any engine starts
    except (ArchiveNotFound, TokenizerError) as exc:
        fail(str(exc))
    try:
        asyncio.run(_serve(settings, generated, run_dir, step_log, ask))
    except TaskDied as exc:  # the server stopped serving on its own
        fail(str(exc), 1)
    except OSError as exc:  # the port is taken, the address cannot be bound
        fail(f"cannot serve on {settings.host}:{settings.port}: {exc}", 1)
    except ValueError as exc:  # the policy or its search cannot start
        fail(f"cannot start the policy: {exc}", 1)


def _ask_options(ctx: typer.Context, model: Path | None, index: Path | None, retriever: list[str] | None,
                 config: Path | None, engine: str | None) -> dict[str, Any] | None:
    """What the ask page needs (the asker factory from the CLI's context and its arguments), or None without
    --model; bad combinations exit 2."""
    if model is None:
        if index is not None or retriever:
            fail("--index and --retriever are for the ask page: give --model too")
        return None
    model_dir_or_exit(model)
    if (index is None) == (not retriever):
        fail("with --model give where it searches: --index DIR or --retriever ADDRESS (one of them)")
    if index is not None and not (index / "manifest.json").is_file():
        fail(f"{index} is not an index directory (no manifest.json)")
    open_asker = getattr(ctx.find_root().obj, "open_asker", None)
    if open_asker is None:
        fail("this build of the viewer cannot ask a policy (no asker)")
    source = {"index": index} if index is not None else {"retriever": retriever}
    return {"open": open_asker, "model": model, "config": config, "engine": engine, "source": source,
            "where": str(index) if index is not None else ", ".join(retriever or [])}


async def _serve(settings: ViewerSettings, generated: bool, run_dir: Path | None, step_log: Path | None,
                 ask: dict[str, Any] | None) -> None:
    """Start the policy to ask (when there is one), serve the pages until SIGTERM/SIGINT, stop both."""
    import asyncio
    import contextlib

    from searchr1.core.servers import HttpServer, install_shutdown_signals
    from searchr1.core.supervise import Supervisor
    from searchr1.viewer.app import create_app

    async with contextlib.AsyncExitStack() as stack:
        asker, info = None, None
        if ask is not None:
            typer.echo(f"starting a policy to ask: {ask['model']} …")
            asker = await stack.enter_async_context(ask["open"](ask["model"], config=ask["config"],
                                                                engine=ask["engine"], **ask["source"]))
            info = {"model": str(ask["model"]), "source": ask["where"],
                    "decoding": f"greedy, max_turns {asker.settings.agent.max_turns}, {asker.settings.engine.kind}"}
        app = create_app(run_dir, settings, step_log, asker=asker, ask_info=info)
        server = HttpServer(app, settings.host, settings.port)
        await server.start()
        page = "/" if run_dir is not None else "/ask"
        typer.echo(f"searchr1 viewer of {run_dir or ask and ask['model']} on {server.url}{page}" + (
            f"?token={settings.token}" if generated else "?token=…" if settings.token else ""))
        stop = asyncio.Event()
        install_shutdown_signals(stop)
        supervisor = Supervisor("viewer")
        supervisor.watch("http server", server.task)  # type: ignore[arg-type]  # started above
        try:
            await supervisor.wait(stop)
        finally:
            await supervisor.close()
            await server.stop()


def register(groups: Groups) -> None:
    """Add `view` to the top-level CLI."""
    groups.app.command("view")(view)
