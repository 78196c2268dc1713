"""``journal timestamp-rule``: enforce the write rule in the database, for foreign writers."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from ..errors import InvalidArgument
from ..postgres import timestamp_rule
from ..postgres.connections import connect
from ..postgres.dsn import target_of
from ..postgres.errors import mapped_errors
from . import app
from .common import DataDirOption, DsnOption, SchemaOption, settings_from, target_dsn


@app.command("timestamp-rule")
def timestamp_rule_command(
    action: Annotated[str, typer.Argument(help="install | remove | status")],
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Make horizon mode sound with writers that do not follow this library's timestamp rule
    (Akka Persistence R2DBC services sharing the tables): a trigger stamps their rows inside the
    insert, after the table lock. See docs/jvm-interop.md."""
    if action not in ("install", "remove", "status"):
        raise InvalidArgument(f"action must be install, remove or status; got {action!r}")
    settings = settings_from(schema, data_dir)
    target, _ = target_dsn(dsn, settings)

    async def go() -> bool:
        conn = await connect(target, settings)
        try:
            with mapped_errors(f"timestamp-rule {action}", target_of(target)):
                if action == "install":
                    await timestamp_rule.install(conn, settings.schema)
                elif action == "remove":
                    await timestamp_rule.remove(conn, settings.schema)
                return await timestamp_rule.installed(conn, settings.schema)
        finally:
            await conn.close()

    on = asyncio.run(go())
    typer.echo(f"timestamp rule {'installed' if on else 'not installed'} on schema {settings.schema}")
