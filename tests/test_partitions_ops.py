"""Operations around a journal over several databases: what a replication endpoint does with one.

Real servers (``partition_fixtures``).
"""

from __future__ import annotations

import asyncpg
import pytest
from endpoint_processes import free_address

from journal import JournalSettings, UnsupportedOperation
from journal.postgres import asyncpg_dsn
from journal.replication.config import EndpointConfig
from journal.replication.endpoint import ReplicationEndpoint
from tests.support.waiting import wait_until


async def _fetchval(dsn: str, sql: str) -> object:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


OTHER_SESSIONS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"


async def test_a_replication_endpoint_over_a_partitioned_journal_is_refused_and_leaves_nothing(
    parts: list[str],
) -> None:
    """A replicated log's positions and version vector are written in the transaction of its
    events; a partitioned location spreads a log's events over databases, so the endpoint is
    refused when it starts: nothing of replication written, the journal it opened closed."""
    a, b = parts[:2]
    config = EndpointConfig.from_dict(
        {
            "location": "P",
            "dsn": a,
            "listen": free_address(),
            "logs": ["Item"],
            "application": {"name": "shop", "version": "1.0"},
        }
    )
    endpoint = ReplicationEndpoint(config, JournalSettings.load(env={}, databases=[a, b]))
    with pytest.raises(UnsupportedOperation, match="replication needs a location in one database"):
        await endpoint.start()
    for d in (a, b):
        assert await _fetchval(d, "SELECT count(*) FROM replication_log") == 0
        await wait_until(lambda d=d: _no_sessions(d), what=f"the endpoint's connections to {d} closed")


async def _no_sessions(dsn: str) -> bool:
    return await _fetchval(dsn, OTHER_SESSIONS) == 0
