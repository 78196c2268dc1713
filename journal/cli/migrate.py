"""``journal migrate`` and ``journal info``."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from ..postgres.dsn import redact
from . import app
from .common import DataDirOption, DsnOption, SchemaOption, settings_from, target_dsn


@app.command()
def migrate(
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    revision: Annotated[str, typer.Option(help="Target revision (default: head).")] = "head",
    sql: Annotated[bool, typer.Option("--sql", help="Print the DDL instead of applying it.")] = False,
    downgrade: Annotated[bool, typer.Option("--downgrade", help="Downgrade to --revision (e.g. base).")] = False,
) -> None:
    """Create or upgrade the journal tables (Alembic migrations shipped in the package)."""
    from ..postgres import migrations

    settings = settings_from(schema, data_dir)
    if sql:
        typer.echo(migrations.offline_sql(settings.schema, revision))
        return
    target, embedded = target_dsn(dsn, settings)
    where = f"embedded PostgreSQL ({settings.connection.data_dir})" if embedded else redact(target)
    if downgrade:
        migrations.downgrade(target, settings.schema, revision)
        typer.echo(f"downgraded {where} schema {settings.schema} to {revision}")
    else:
        migrations.upgrade(target, settings.schema, revision)
        typer.echo(f"migrated {where} schema {settings.schema} to {migrations.head_revision()}")


@app.command()
def info(dsn: DsnOption = None, schema: SchemaOption = None, data_dir: DataDirOption = None) -> None:
    """Server version, schema revision and event counts per entity type."""
    from ..postgres.backend import PostgresBackend
    from ..postgres.migrations import head_revision

    settings = settings_from(schema, data_dir)
    target, embedded = target_dsn(dsn, settings)

    async def go() -> dict[str, object]:
        backend = PostgresBackend(target, settings.with_dsn(target))
        await backend.start()
        try:
            return await backend.info()
        finally:
            await backend.close()

    data = asyncio.run(go())
    typer.echo(f"database:        {'embedded ' + str(settings.connection.data_dir) if embedded else redact(target)}")
    typer.echo(f"server:          PostgreSQL {data['server_version']}")
    typer.echo(f"schema:          {settings.schema} (revision {data['schema_revision']}, head {head_revision()})")
    events = data["events"]
    assert isinstance(events, dict)
    typer.echo(f"events:          {sum(events.values())}")
    for et, n in events.items():
        typer.echo(f"  {et or '(no entity type)':<20} {n}")
