"""Locations for replication tests: one scratch database per location on the session's server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from journal import Journal, JournalSettings, open_journal
from journal.postgres.backend import PostgresBackend
from journal.postgres.migrations import upgrade
from journal.postgres.replication_store import PostgresReplicationStore
from tests.support.scratch import scratch_database


@contextlib.contextmanager
def location_databases(server_dsn: str, names: list[str]) -> Iterator[dict[str, str]]:
    """A migrated database per location name (sync: call from a sync fixture)."""
    with contextlib.ExitStack() as stack:
        dbs = {n: stack.enter_context(scratch_database(server_dsn, f"sjrepl{n.lower()}")) for n in names}
        for db in dbs.values():
            upgrade(db)
        yield dbs


@dataclass
class Location:
    name: str
    dsn: str
    journal: Journal
    store: PostgresReplicationStore


@contextlib.asynccontextmanager
async def open_location(name: str, dsn: str, logs: list[str]) -> AsyncIterator[Location]:
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn), migrate=False) as j:
        assert isinstance(j.backend, PostgresBackend)
        store = PostgresReplicationStore(j.backend, name)
        for log in logs:
            await store.ensure_log(log)
        yield Location(name, dsn, j, store)
