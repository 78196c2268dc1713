"""``journal migrate`` and ``journal info``."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated

import typer

from ..errors import ConfigurationError
from ..postgres import redact
from . import app
from .common import DataDirOption, DsnOption, SchemaOption, check_reachable, settings_from, target_dsn


@app.command()
def migrate(
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    revision: Annotated[str, typer.Option(help="Target revision (default: head).")] = "head",
    sql: Annotated[bool, typer.Option("--sql", help="Print the DDL instead of applying it.")] = False,
    downgrade: Annotated[bool, typer.Option("--downgrade", help="Downgrade to --revision (e.g. base).")] = False,
    yes: Annotated[
        bool, typer.Option("--yes", help="Confirm a downgrade that drops tables holding rows (no question asked).")
    ] = False,
) -> None:
    """Create or upgrade the journal tables (Alembic migrations shipped in the package).

    A downgrade that would drop tables holding rows lists them with their row counts and asks;
    without a terminal it needs --yes."""
    from ..postgres import schema_migrations

    migrations = schema_migrations()

    settings = settings_from(schema, data_dir)
    if sql:
        typer.echo(migrations.offline_sql(settings.schema, revision))
        return
    migrations.check_revision(revision)
    target, embedded = target_dsn(dsn, settings)
    where = f"embedded PostgreSQL ({settings.connection.data_dir})" if embedded else redact(target)
    check_reachable(target, settings)
    before = migrations.current_revision(target, settings.schema)
    if downgrade:
        drops = {t: n for t, n in migrations.downgrade_drops(target, settings.schema, revision).items() if n}
        if drops and not yes:
            listed = ", ".join(f"{t} ({n} rows)" for t, n in drops.items())
            question = f"downgrading {where} schema {settings.schema} to {revision} drops {listed}"
            if not sys.stdin.isatty():
                raise ConfigurationError(f"{question}: run again with --yes to confirm")
            if not typer.confirm(f"{question}. Drop them?", default=False, err=True):
                raise typer.Exit(1)
        migrations.downgrade(target, settings.schema, revision)
    else:
        migrations.upgrade(target, settings.schema, revision)
    after = migrations.current_revision(target, settings.schema)
    verb = "downgraded" if downgrade else "migrated"
    change = f"from {before or 'nothing'} to {after or 'base'}" if before != after else f"already at {after or 'base'}"
    head = migrations.head_revision()
    typer.echo(f"{verb} {where} schema {settings.schema} {change}" + ("" if after == head else f" (head is {head})"))


@app.command()
def info(dsn: DsnOption = None, schema: SchemaOption = None, data_dir: DataDirOption = None) -> None:
    """Server version, schema revision and event counts per entity type."""
    from ..postgres import PostgresBackend, schema_migrations

    head_revision = schema_migrations().head_revision

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
        typer.echo(f"  {et or '(none: pids without an entity type)':<20} {n}")
