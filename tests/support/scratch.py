"""Throwaway databases on a server: for tests, benchmarks and demos, never for a service's data."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from journal.postgres.dsn import asyncpg_dsn


def with_database(dsn: str, database: str) -> str:
    """The same server DSN, pointing at another database."""
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


async def admin(server_dsn: str, sql: str) -> None:
    """Run one statement on the server (CREATE/DROP DATABASE...)."""
    conn = await asyncpg.connect(asyncpg_dsn(server_dsn))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.contextmanager
def scratch_database(server_dsn: str, prefix: str = "sjtmp") -> Iterator[str]:
    """Create an empty database with a random name, yield its DSN, drop it afterwards (sync)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    asyncio.run(admin(server_dsn, f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(server_dsn, name)
    finally:
        asyncio.run(admin(server_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
