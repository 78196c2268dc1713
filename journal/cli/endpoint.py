"""``journal endpoint run|status``: a location's replication endpoint (see docs/replication.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Annotated

import typer

from . import app
from .failures import exit_code

endpoint_app = typer.Typer(help="Replication endpoints: replicated event logs between locations.", no_args_is_help=True)
app.add_typer(endpoint_app, name="endpoint")

ConfigOption = Annotated[Path, typer.Option("--config", help="Endpoint config file (.toml or .json).")]


@endpoint_app.command("run")
def run_endpoint(
    config: ConfigOption,
    recover: Annotated[bool, typer.Option("--recover", help="Disaster recovery first: rebuild from peers.")] = False,
) -> None:
    """Run the endpoint until SIGTERM/SIGINT: serve this location's logs, pull its connections'."""
    from ..errors import JournalUnavailable
    from ..replication.config import EndpointConfig
    from ..replication.endpoint import ReplicationEndpoint

    cfg = EndpointConfig.load(config)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with ReplicationEndpoint(cfg, recover=recover) as ep:
            if ep.recovering:  # --recover, or a recovery that did not complete: nothing pulls or stamps before it
                try:
                    recovered = await ep.recover()
                except JournalUnavailable as e:
                    typer.secho(
                        f"error: endpoint {cfg.location} recovery failed: {e}; local writes stay refused "
                        "until a recovery succeeds (run again with --recover)",
                        err=True,
                        fg=typer.colors.RED,
                    )
                    raise typer.Exit(1) from e
                typer.echo(f"endpoint {cfg.location} recovered {recovered}", err=True)
            typer.echo(f"endpoint {cfg.location} listening on {cfg.listen} (logs: {', '.join(cfg.logs)})", err=True)
            await stop.wait()
            await ep.stop()

    from .. import runtime

    runtime.run(main())  # uvloop and the tuned collector, as `projections run`: a long-running service


@endpoint_app.command("status")
def status(
    config: ConfigOption,
    address: Annotated[
        str | None, typer.Option(help="Ask this endpoint instead of the config's listen address.")
    ] = None,
) -> None:
    """Print the running endpoint's status as JSON: logs (position, version vector, progress per
    source) and connections (location, availability per log)."""
    from ..errors import JournalUnavailable
    from ..replication.config import EndpointConfig
    from ..replication.transport import RemoteSource

    cfg = EndpointConfig.load(config)

    async def main() -> dict[str, object]:
        source = RemoteSource(address or cfg.listen, cfg.tls, timeout=10.0)
        try:
            return await source.info()
        finally:
            with contextlib.suppress(Exception):
                await source.close()

    try:
        typer.echo(json.dumps(asyncio.run(main()), indent=2, sort_keys=True))
    except JournalUnavailable as e:
        typer.secho(f"error: endpoint not reachable: {e}", err=True, fg=typer.colors.RED)
        raise typer.Exit(exit_code(e)) from e


@endpoint_app.command("delete")
def delete(
    config: ConfigOption,
    log: Annotated[str, typer.Option("--log", help="The log (entity type) to delete from.")],
    to: Annotated[int, typer.Option("--to", help="Delete the log's events up to this log sequence number.")],
    physically_after: Annotated[
        list[str] | None,
        typer.Option(
            "--physically-after",
            help="Also remove the deleted events once this location has stored them (repeatable).",
        ),
    ] = None,
) -> None:
    """Delete a log's events up to a position at this location: logically at once (local reads skip
    them, replication still sends them); physically only as far as every ``--physically-after``
    location has stored them. Run it again later to remove the rest. Prints the positions as JSON."""
    from ..errors import JournalError
    from ..replication.config import EndpointConfig
    from ..replication.endpoint import delete_at_location

    cfg = EndpointConfig.load(config)
    try:
        logical, physical = asyncio.run(
            delete_at_location(cfg, log, to, physically_after=tuple(physically_after or ()))
        )
    except JournalError as e:
        typer.secho(f"error: cannot delete: {e}", err=True, fg=typer.colors.RED)
        raise typer.Exit(exit_code(e)) from e
    typer.echo(json.dumps({"log": log, "logically_deleted_to": logical, "physically_deleted_to": physical}))
