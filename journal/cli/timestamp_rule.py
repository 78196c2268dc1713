"""``journal timestamp-rule``: enforce the write rule in the database, for foreign writers."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from ..errors import InvalidArgument
from ..postgres import (
    connect,
    install_timestamp_rule,
    mapped_errors,
    redact,
    remove_timestamp_rule,
    target_of,
    timestamp_rule_installed,
)
from . import app
from .common import DatabasesOption, DataDirOption, DsnOption, SchemaOption, settings_from, target_dsn


@app.command("timestamp-rule")
def timestamp_rule_command(
    action: Annotated[str, typer.Argument(help="install | remove | status")],
    dsn: DsnOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Make horizon mode sound with writers that do not follow this library's timestamp rule
    (Akka Persistence R2DBC services sharing the tables): a trigger stamps their rows inside the
    insert, after the table lock, and another writes the tag view rows of their tagged events.
    See docs/jvm-interop.md. With several databases, on each one."""
    if action not in ("install", "remove", "status"):
        raise InvalidArgument(f"action must be install, remove or status; got {action!r}")
    settings = settings_from(schema, data_dir, databases)
    target, _ = target_dsn(dsn, settings)

    async def one(dsn: str) -> bool:
        conn = await connect(dsn, settings)
        try:
            with mapped_errors(f"timestamp-rule {action}", target_of(dsn)):
                if action == "install":
                    await install_timestamp_rule(conn, settings.schema)
                elif action == "remove":
                    await remove_timestamp_rule(conn, settings.schema)
                return await timestamp_rule_installed(conn, settings.schema)
        finally:
            await conn.close()

    targets = list(settings.partitions.databases) or [target]
    for d in targets:
        on = asyncio.run(one(d))
        where = f" of {redact(d)}" if settings.partitions.databases else ""
        typer.echo(f"timestamp rule {'installed' if on else 'not installed'} on schema {settings.schema}{where}")
