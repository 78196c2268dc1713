"""Locations for replication tests: one scratch database per location on the session's server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from conftest import truncate_all

from journal import Journal, JournalSettings, open_journal
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
        store = j.backend.replication_store(name)
        assert isinstance(store, PostgresReplicationStore)  # the tests also read its statements
        for log in logs:
            await store.ensure_log(log)
        yield Location(name, dsn, j, store)


@contextlib.asynccontextmanager
async def open_locations(dbs: dict[str, str], logs: list[str]) -> AsyncIterator[dict[str, Location]]:
    """Every location of ``dbs``, emptied first, opened with ``logs`` (a test's ``locs`` fixture)."""
    for db in dbs.values():
        await truncate_all(db)
    async with contextlib.AsyncExitStack() as stack:
        yield {n: await stack.enter_async_context(open_location(n, db, logs)) for n, db in dbs.items()}
