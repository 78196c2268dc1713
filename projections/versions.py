"""Projection versions: rebuild a read model without downtime (docs/projections.md).

Version N of projection ``NAME`` keeps its offsets and leases under ``NAME@N`` (a projection of
its own to the offset store) and its tables in a schema of its own (:func:`tables_schema`):
each handler transaction runs with ``SET LOCAL search_path`` to it, so the handler's unqualified
table names are the version's. Readers read views in the journal's schema.
:func:`switch_version` is one transaction: it holds the serving version's commits (its lease
rows, FOR UPDATE), waits until the new version has every event the serving one has, re-creates
the readers' views over the new version's relations and marks the rows (new ``serving``, old
``retired``). A reader blocked on a view's lock meanwhile resolves the name again after the
commit (PostgreSQL re-looks a name up when invalidations arrived while it waited), so it sees the
new view, never an error. The retired version's workers stop at their next lease round; then
:func:`drop_version` drops its schema and rows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from journal import Journal
from journal.errors import InvalidArgument, UnknownProjection, VersionNotReady
from journal.ids import validate_entity_type, validate_name
from journal.postgres import connect
from journal.settings import JournalSettings

from .version_store import VersionSql

T = TypeVar("T")

SEPARATOR = "@"
"""Between a projection's name and its version in the offset store: ``NAME@N``."""
MAX_SCHEMA_BYTES = 63
"""PostgreSQL's identifier limit: a version's schema name must fit."""
POLL_SECONDS = 0.02
"""How often a switch looks again whether the new version has caught up (the serving version's
commits are held meanwhile, so this bounds how long a reader's data waits)."""


def validate_version(version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidArgument(f"a projection version is a whole number from 1, got {version!r}")
    return version


def versioned_name(name: str, version: int) -> str:
    """The name version ``version`` of ``name`` keeps its offsets, leases and workers under."""
    validate_name(name, "projection name")
    if SEPARATOR in name:
        raise InvalidArgument(f"the name of a versioned projection must not contain {SEPARATOR!r}: {name!r}")
    return f"{name}{SEPARATOR}{validate_version(version)}"


def tables_schema(journal_schema: str, name: str, version: int) -> str:
    """The schema of version ``version``'s tables: ``NAME@N`` (``<journal schema>.NAME@N`` when
    the journal's schema is not ``public``, so two journals of one database do not share it)."""
    base = versioned_name(name, version)
    schema = base if journal_schema == "public" else f"{journal_schema}.{base}"
    if len(schema.encode()) > MAX_SCHEMA_BYTES:
        raise InvalidArgument(f"schema {schema!r} of version {version} of {name!r} is over 63 bytes: a shorter name")
    return schema


@dataclass(frozen=True)
class ProjectionVersion:
    """A version of a projection's read model, as stored in ``projection_version``."""

    name: str
    version: int
    entity_type: str
    tables_schema: str
    state: str
    """``building`` (catching up, not seen by readers), ``serving`` (the readers' views show its
    tables) or ``retired`` (replaced by a switch: its workers stop; it can be dropped)."""
    created_at: datetime
    switched_at: datetime | None

    @property
    def versioned_name(self) -> str:
        """Its name in the offset store, the leases and ``projections status``: ``NAME@N``."""
        return f"{self.name}{SEPARATOR}{self.version}"

    @staticmethod
    def of(row: Any) -> ProjectionVersion:
        return ProjectionVersion(
            row["projection_name"], row["version"], row["entity_type"], row["tables_schema"], row["state"],
            row["created_at"], row["switched_at"],
        )  # fmt: skip


@dataclass(frozen=True)
class Switched:
    """What :func:`switch_version` did."""

    version: ProjectionVersion
    previous: int | None
    """The version that served before (None: none did)."""
    views: list[str]
    """The readers' views now over the version's relations."""
    done_before: bool = False
    """The version already served: nothing was changed."""


async def register(conn: Any, sql: VersionSql, name: str, version: int, entity_type: str) -> ProjectionVersion:
    """Version ``version`` of ``name`` (created ``building``, with its schema, when new); refused
    when it is retired or projects another entity type."""
    schema = tables_schema(sql.schema, name, version)
    validate_entity_type(entity_type, required=True)
    v = ProjectionVersion.of(await sql.register(conn, name, version, entity_type, schema))
    if v.entity_type != entity_type:
        raise VersionNotReady(
            f"version {version} of {name!r} projects entity type {v.entity_type!r}, not {entity_type!r}"
        )
    if v.state == "retired":
        raise VersionNotReady(
            f"version {version} of {name!r} is retired (another version serves): run a new version to rebuild"
        )
    return v


async def listed(conn: Any, sql: VersionSql, name: str | None = None) -> list[ProjectionVersion]:
    return [ProjectionVersion.of(r) for r in await sql.versions(conn, name)]


def _unknown(name: str, version: int, rows: list[ProjectionVersion]) -> UnknownProjection:
    if not rows:
        return UnknownProjection(
            f"projection {name!r} has no versions: run one with projections run {name} --version {version}"
        )
    known = ", ".join(f"{v.version} ({v.state})" for v in rows)
    return UnknownProjection(f"projection {name!r} has no version {version}: its versions are {known}")


async def switch(conn: Any, sql: VersionSql, name: str, version: int, wait: float = 5.0) -> Switched:
    """Make ``version`` the one readers see, in one transaction (see the module docstring);
    :class:`VersionNotReady` when it has not caught up within ``wait`` seconds (nothing changed)."""
    validate_name(name, "projection name")
    validate_version(version)
    deadline = time.monotonic() + wait
    while True:
        try:
            async with conn.transaction():
                return await _switch(conn, sql, name, version, wait, deadline)
        except asyncpg.DeadlockDetectedError:  # against a lease round of the serving version: again
            if time.monotonic() > deadline:
                raise


async def _switch(conn: Any, sql: VersionSql, name: str, version: int, wait: float, deadline: float) -> Switched:
    rows = [ProjectionVersion.of(r) for r in await sql.versions(conn, name, lock=True)]
    target = next((v for v in rows if v.version == version), None)
    if target is None:
        raise _unknown(name, version, rows)
    if target.state == "serving":
        return Switched(target, None, [], done_before=True)
    if target.state == "retired":
        raise VersionNotReady(f"version {version} of {name!r} is retired: it stopped when it was replaced")
    serving = next((v for v in rows if v.state == "serving"), None)
    if serving is not None:
        await sql.hold_commits(conn, serving.versioned_name)
        while (behind := await sql.behind(conn, target.versioned_name, serving.versioned_name)) > 0:
            if time.monotonic() > deadline:
                raise VersionNotReady(
                    f"version {version} of {name!r} has not caught up with version {serving.version}: "
                    f"{behind} persistence ids behind after {wait:g} s (nothing changed; see projections status)"
                )
            await asyncio.sleep(POLL_SECONDS)
    tables = await sql.relations(conn, target.tables_schema)
    if not tables:
        raise VersionNotReady(
            f"version {version} of {name!r} has no tables in schema {target.tables_schema!r} yet "
            "(its handler creates them; nothing changed)"
        )
    ours = await sql.views_over(conn, [v.tables_schema for v in rows])
    taken = sorted(set(tables) & set(await sql.relations(conn, sql.schema)) - set(ours))
    if taken:
        raise VersionNotReady(
            f"schema {sql.schema!r} already has {', '.join(taken)}, not a view of a version of {name!r}: "
            "rename it or the version's table (nothing changed)"
        )
    for view in ours:
        await sql.drop_view(conn, view)
    for table in tables:
        await sql.create_view(conn, table, target.tables_schema)
    await sql.set_serving(conn, name, version)
    return Switched(target, serving.version if serving else None, tables)


async def drop(conn: Any, sql: VersionSql, name: str, version: int) -> ProjectionVersion:
    """Drop a version that does not serve, once its workers have stopped: its schema (tables),
    offsets, leases, workers' rows, pauses, dead letters and version row, in one transaction."""
    validate_name(name, "projection name")
    validate_version(version)
    async with conn.transaction():
        rows = [ProjectionVersion.of(r) for r in await sql.versions(conn, name, lock=True)]
        target = next((v for v in rows if v.version == version), None)
        if target is None:
            raise _unknown(name, version, rows)
        if target.state == "serving":
            raise VersionNotReady(f"version {version} of {name!r} serves the readers: switch to another first")
        live = await sql.live_workers(conn, target.versioned_name)
        if live:
            raise VersionNotReady(
                f"version {version} of {name!r} has {live} running worker(s): stop them first "
                "(a retired version's stop by themselves within a lease round)"
            )
        await sql.drop(conn, name, version, target.versioned_name, target.tables_schema)
    return target


async def status_names(conn: Any, sql: Any, name: str | None) -> tuple[list[str], list[ProjectionVersion]]:
    """What ``projections status [NAME]`` shows: the projections (a versioned projection's
    name: each of its versions, ``NAME@N``), and every version row."""
    every = await listed(conn, VersionSql(sql.schema))
    if name is None:
        return await sql.projection_names(conn), every
    of_name = [v.versioned_name for v in every if v.name == name]
    if of_name and not await sql.is_known(conn, name):
        return of_name, every
    return [name], every


def by_versioned_name(rows: list[ProjectionVersion]) -> dict[str, dict[str, Any]]:
    """The version rows for ``projections status`` (its ``version`` field in JSON)."""
    return {
        v.versioned_name: {
            "name": v.name, "version": v.version, "state": v.state, "entity_type": v.entity_type,
            "tables_schema": v.tables_schema, "switched_at": v.switched_at,
        }
        for v in rows
    }  # fmt: skip


# -- the library's entry points: on a journal's pool, or a connection of their own --------------


async def _on(source: Journal | JournalSettings, fn: Callable[[Any, VersionSql], Awaitable[T]]) -> T:
    if isinstance(source, JournalSettings):
        dsn = source.connection.dsn
        if dsn is None:
            raise InvalidArgument("projection versions need settings with a DSN")
        conn = await connect(dsn, source)
        try:
            return await fn(conn, VersionSql(source.schema))
        finally:
            await conn.close()
    async with source.backend.shared_connections().pool.acquire() as conn:
        return await fn(conn, VersionSql(source.settings.schema))


async def register_on(
    source: Journal | JournalSettings, name: str, version: int, entity_type: str
) -> ProjectionVersion:
    """:func:`register` on ``source``: what ``projections run --version`` checks before its
    workers start (a retired version, another entity type: :class:`VersionNotReady`)."""
    return await _on(source, lambda c, s: register(c, s, name, version, entity_type))


async def list_versions(source: Journal | JournalSettings, name: str | None = None) -> list[ProjectionVersion]:
    """The versions of projection ``name`` (of every projection: None), by name and version.
    ``source``: an open journal on PostgreSQL (its home database) or settings with a DSN."""
    return await _on(source, lambda c, s: listed(c, s, name))


async def switch_version(source: Journal | JournalSettings, name: str, version: int, wait: float = 5.0) -> Switched:
    """Make version ``version`` of ``name`` the one readers see (atomically: one transaction).

    Raises:
        UnknownProjection: ``name`` has no such version.
        VersionNotReady: it is retired, has no tables, a relation of the readers' schema that is
            not one of the projection's views has the name of one of its tables, or it has not
            caught up with the serving version within ``wait`` seconds. Nothing is changed.
    """
    return await _on(source, lambda c, s: switch(c, s, name, version, wait))


async def drop_version(source: Journal | JournalSettings, name: str, version: int) -> ProjectionVersion:
    """Drop version ``version`` of ``name`` (not the serving one; its workers stopped): its
    schema with its tables, and every row of ``NAME@N``. Raises as :func:`switch_version`."""
    return await _on(source, lambda c, s: drop(c, s, name, version))
