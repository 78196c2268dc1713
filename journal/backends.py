"""The one place a backend is chosen: from the DSN's scheme (or none: an embedded PostgreSQL).

Algorithms a backend needs from above the seam are composed here and handed in (the Cassandra
backend's tag writers), so no backend imports an algorithm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .backend import Backend, TagStore
from .errors import ConfigurationError
from .settings import JournalSettings

if TYPE_CHECKING:
    from .partitioned.backend import PartitionedBackend
    from .postgres import PartitionRow

POSTGRES_SCHEMES = ("postgresql", "postgres")
CASSANDRA_SCHEME = "cassandra"


def backend_kind(dsn: str | None) -> str:
    """``"embedded"`` (no DSN), ``"postgres"`` or ``"cassandra"``; ConfigurationError otherwise."""
    if dsn is None:
        return "embedded"
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigurationError("DSN must be a non-empty string")
    scheme = urlsplit(dsn).scheme.split("+")[0]
    if scheme in POSTGRES_SCHEMES:
        return "postgres"
    if scheme == CASSANDRA_SCHEME:
        return "cassandra"
    raise ConfigurationError(
        f"unknown journal DSN scheme {scheme!r}: not a PostgreSQL DSN (postgresql://...) "
        "nor a Cassandra one (cassandra://host1,host2[:port]/keyspace)"
    )


async def open_backend(
    dsn: str | None, settings: JournalSettings, *, migrate: bool | None = None
) -> tuple[Backend, JournalSettings]:
    """Open (start) the backend the DSN names; returns it with the settings it runs with (the
    embedded server's DSN filled in). ``migrate``: run the Postgres migrations first (default:
    only for the embedded server)."""
    databases = settings.partitions.databases
    if databases:
        return await _open_partitioned(databases, dsn, settings, migrate=bool(migrate))
    kind = backend_kind(dsn)
    if kind == "cassandra":
        assert dsn is not None
        return await _open_cassandra(dsn, settings), settings
    from .postgres import PostgresBackend, schema_migrations, start_embedded

    target = dsn
    if target is None:
        target = await asyncio.to_thread(start_embedded, settings.connection.data_dir)
    if migrate if migrate is not None else kind == "embedded":
        await asyncio.to_thread(schema_migrations().upgrade, target, settings.schema)
    settings = settings.with_dsn(target)
    backend = PostgresBackend(target, settings)
    await backend.start()
    if not _serves_every_slice(await backend.partitions().rows()):
        # a database partitioned by another journal (a range moved away): follow its map
        await backend.close()
        return await _open_partitioned((target,), target, settings, migrate=False, claim=False)
    return backend, settings


def _serves_every_slice(rows: Sequence[PartitionRow]) -> bool:
    from .postgres import OWNED

    return not rows or (
        len(rows) == 1 and rows[0].min_slice == 0 and rows[0].max_slice == 1023 and rows[0].state == OWNED
    )


async def open_partitioned(dsn: str | None, settings: JournalSettings) -> PartitionedBackend:
    """The databases of ``partitions.databases`` (else the one DSN, partitioned from now on) as a
    partitioned backend, started: what the partition tools work on (``journal partitions``)."""
    databases = settings.partitions.databases
    if not databases:
        if dsn is None or backend_kind(dsn) != "postgres":
            raise ConfigurationError("partition tools need PostgreSQL: set partitions.databases or a DSN")
        databases = (dsn,)
    backend, _ = await _open_partitioned(databases, dsn, settings, migrate=False)
    from .partitioned.backend import PartitionedBackend

    assert isinstance(backend, PartitionedBackend)
    return backend


async def _open_partitioned(
    databases: Sequence[str], dsn: str | None, settings: JournalSettings, *, migrate: bool, claim: bool = True
) -> tuple[Backend, JournalSettings]:
    """Several databases by slice range (``partitions.databases``); ``dsn`` is the home database."""
    from .partitioned.backend import PartitionedBackend

    for d in databases:
        if backend_kind(d) != "postgres":
            raise ConfigurationError(f"partitions databases must be PostgreSQL DSNs, got {d!r}")
    home = dsn or databases[0]
    if migrate:
        from .postgres import schema_migrations

        upgrade = schema_migrations().upgrade

        for d in dict.fromkeys((*databases, home)):
            await asyncio.to_thread(upgrade, d, settings.schema)
    settings = settings.with_dsn(home)
    backend = PartitionedBackend(databases, settings, home)
    try:
        await backend.start(claim=claim)
    except BaseException:
        await backend.close()
        raise
    if not backend.dbs.map.served():
        await backend.close()
        raise ConfigurationError(
            f"no database of this journal serves a slice ({', '.join(backend.dbs.names)}): "
            "is this the home database of a partitioned journal? set partitions.databases"
        )
    return backend, settings


async def _open_cassandra(dsn: str, settings: JournalSettings) -> Backend:
    try:
        from .cassandra.backend import CassandraBackend
        from .cassandra.connections import parse_target
    except ImportError as e:
        raise ConfigurationError(
            f"the Cassandra backend needs the 'cassandra' extra: pip install 'slice-journal[cassandra]' ({e})"
        ) from e
    from .tags.writer import TagWriters

    def tag_writers(store: TagStore) -> TagWriters:
        return TagWriters(store, settings.tags)

    hosts, port, keyspace = parse_target(dsn)
    backend: Backend = CassandraBackend(hosts, port, keyspace, settings, tag_writers)
    await backend.start()
    return backend
