"""``journal migrate`` and ``journal info``."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated, Any

import typer

from ..errors import ConfigurationError, JournalUnavailable
from ..postgres import redact
from ..settings import JournalSettings
from . import app
from .common import DatabasesOption, DataDirOption, DsnOption, SchemaOption, check_reachable, target_dsn
from .partitions import partition_settings


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
    databases: DatabasesOption = None,
) -> None:
    """Create or upgrade the journal tables (Alembic migrations shipped in the package).

    With several databases (``--databases`` or $JOURNAL_DATABASES), every one of them and the
    home database (``--dsn``, default the first), each reported; then each records its slice
    range. A downgrade that would drop tables holding rows lists them with their row counts and
    asks; without a terminal it needs --yes."""
    from ..postgres import schema_migrations

    migrations = schema_migrations()

    settings = partition_settings(schema, data_dir, databases)
    if sql:
        typer.echo(migrations.offline_sql(settings.schema, revision))
        return
    migrations.check_revision(revision)
    if settings.partitions.databases:
        from ..journal import resolve_dsn

        home = resolve_dsn(dsn, settings) or settings.partitions.databases[0]
        for target in dict.fromkeys((*settings.partitions.databases, home)):
            _migrate_one(target, redact(target), settings, revision, downgrade=downgrade, yes=yes)
        if not downgrade:
            for line in asyncio.run(_claim(home, settings)):
                typer.echo(line)
        return
    target, embedded = target_dsn(dsn, settings)
    where = f"embedded PostgreSQL ({settings.connection.data_dir})" if embedded else redact(target)
    _migrate_one(target, where, settings, revision, downgrade=downgrade, yes=yes)


async def _claim(home: str, settings: JournalSettings) -> list[str]:
    """Each database records its slice range (the layout of partitions.databases)."""
    from ..backends import open_partitioned

    backend = await open_partitioned(home, settings)
    try:
        dbs = backend.dbs
        return [f"slices {lo}-{hi}: {name}" for lo, hi, name in dbs.map.describe(dbs.names)]
    finally:
        await backend.close()


def _migrate_one(
    target: str, where: str, settings: JournalSettings, revision: str, *, downgrade: bool, yes: bool
) -> None:
    from ..postgres import schema_migrations

    migrations = schema_migrations()

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
def info(
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    databases: DatabasesOption = None,
) -> None:
    """Server version, schema revision, event counts per entity type and durable state rows (of
    each database, and the slices it serves, when the journal has several)."""
    from ..backends import open_backend
    from ..postgres import schema_migrations

    head_revision = schema_migrations().head_revision

    settings = partition_settings(schema, data_dir, databases)
    target, embedded = target_dsn(dsn, settings)  # with several databases: the home one

    async def go() -> dict[str, Any]:
        backend, _ = await open_backend(target, settings, migrate=False)
        try:
            return await backend.info()
        finally:
            await backend.close()

    data = asyncio.run(go())
    reports = data.get("databases")
    for d in reports if isinstance(reports, list) else [{"database": None, **data}]:
        name = d["database"] or (f"embedded {settings.connection.data_dir}" if embedded else redact(str(target)))
        typer.echo(f"database:        {name}")
        if "error" in d:
            typer.echo(f"  unavailable:   {d['error']}")
            if d.get("slices"):
                typer.echo(f"slices:          {', '.join(d['slices'])} (their operations fail until it answers)")
            continue
        typer.echo(f"server:          PostgreSQL {d['server_version']}")
        typer.echo(f"schema:          {settings.schema} (revision {d['schema_revision']}, head {head_revision()})")
        if "slices" in d:
            typer.echo(f"slices:          {', '.join(d['slices']) or '(none)'}")
        events = d["events"]
        assert isinstance(events, dict)
        typer.echo(f"events:          {sum(events.values())}")
        for et, n in events.items():
            typer.echo(f"  {et or '(none: pids without an entity type)':<20} {n}")
        states = d.get("durable_state")
        if states is not None:
            typer.echo(f"durable states:  {states['states']} ({states['tombstones']} of them deleted: tombstones)")
    if isinstance(reports, list):
        typer.echo(f"map epoch:       {data['epoch']}; home database {data['home']}")
        down = [str(d["database"]) for d in reports if "error" in d]
        if down:  # the others are reported above; the exit code says that one is missing
            raise JournalUnavailable(f"unavailable: {', '.join(down)} (the other databases are reported above)")
