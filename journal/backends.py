"""The one place a backend is chosen: from the DSN's scheme (or none: an embedded PostgreSQL).

Algorithms a backend needs from above the seam are composed here and handed in (the Cassandra
backend's tag writers), so no backend imports an algorithm.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from .backend import Backend, TagStore
from .errors import ConfigurationError
from .settings import JournalSettings

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
