"""Offset store, leases and management against a real PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from conftest import truncate_all

from journal.errors import ProjectionError
from journal.postgres import LeaseFence
from projections import management
from projections.postgres_store import OffsetRow, ProjectionSql

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SQL = ProjectionSql("public")


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    await truncate_all(dsn)
    c = await asyncpg.connect(dsn)
    yield c
    await c.close()


async def test_save_load_and_prune_keeps_latest_row_per_slice(conn: asyncpg.Connection) -> None:
    rows = [OffsetRow(1, "a", 1, T0), OffsetRow(1, "b", 3, T0 + timedelta(days=2)), OffsetRow(2, "c", 9, T0)]
    await SQL.save_offsets(conn, "p", "0-1023", rows)
    await SQL.save_offsets(conn, "p", "0-1023", rows)  # a repeat is ignored
    loaded = await SQL.load_offsets(conn, "p", [1, 2, 3], timedelta(minutes=5))
    assert loaded[1][0] == T0 + timedelta(days=2) and [r[0] for r in loaded[1][1]] == ["b"]
    assert loaded[2][1] == [("c", 9, T0)] and 3 not in loaded
    assert await SQL.load_pid(conn, "p", 1, "a") == (1, T0)
    deleted = await SQL.prune(conn, "p", [1, 2], timedelta(days=1), timedelta(0))
    assert deleted == 1  # "a" is 2 days behind slice 1's latest; slice 2's only row stays
    assert await SQL.load_pid(conn, "p", 1, "a") is None
    assert await SQL.load_pid(conn, "p", 2, "c") == (9, T0)
    # heartbeat rows: only the newest per slice is kept
    await SQL.save_offsets(conn, "p", "k", [OffsetRow(2, "", 0, T0 + timedelta(hours=1))])
    await SQL.save_offsets(conn, "p", "k", [OffsetRow(2, "", 0, T0 + timedelta(hours=2))])
    n = await conn.fetchval("SELECT count(*) FROM projection_timestamp_offset_store WHERE persistence_id = ''")
    assert n == 1


async def test_prune_drops_superseded_rows_and_spares_recently_consumed_ones(conn: asyncpg.Connection) -> None:
    """Issue 26: a pid's older rows go (validation reads only its latest); nothing consumed within
    ``delete_after_consumed`` goes; the latest row of a slice always stays."""
    rows = [OffsetRow(7, "a", n, T0 + timedelta(seconds=n)) for n in range(1, 6)] + [OffsetRow(7, "b", 1, T0)]
    for r in rows:  # one batch each, as a worker writes them
        await SQL.save_offsets(conn, "p", "k", [r])
    assert await SQL.prune(conn, "p", [7], timedelta(days=1), timedelta(hours=1)) == 0  # all just consumed
    assert await SQL.prune(conn, "p", [7], timedelta(days=1), timedelta(0)) == 4  # a#1..a#4
    left = await conn.fetch("SELECT persistence_id, seq_nr FROM projection_timestamp_offset_store ORDER BY 1")
    assert [(r[0], r[1]) for r in left] == [("a", 5), ("b", 1)]
    assert await SQL.load_pid(conn, "p", 7, "a") == (5, T0 + timedelta(seconds=5))
    # a slice whose only row is far behind everything else keeps it
    await SQL.save_offsets(conn, "p", "k", [OffsetRow(8, "c", 3, T0 - timedelta(days=30))])
    assert await SQL.prune(conn, "p", [7, 8], timedelta(seconds=301), timedelta(0)) == 0
    assert await SQL.load_pid(conn, "p", 8, "c") == (3, T0 - timedelta(days=30))


async def test_leases_fence_and_takeover(conn: asyncpg.Connection) -> None:
    ttl = timedelta(seconds=30)
    await SQL.leases.ensure_leases(conn, "p", 1024)
    a = await SQL.leases.acquire_leases(conn, "p", "A", [0, 1, 2], ttl)
    assert sorted(a) == [0, 1, 2]
    assert await SQL.leases.acquire_leases(conn, "p", "B", [1, 2, 3], ttl) == {3: 1}  # 1, 2 are A's
    async with conn.transaction():
        assert await SQL.leases.fence(conn, "p", "A", a) == []
    # A's leases expire; B takes slice 1 over: A's next transaction is fenced out
    await conn.execute("UPDATE projection_slice_lease SET expires_at = now() - interval '1s' WHERE slice = 1")
    b = await SQL.leases.acquire_leases(conn, "p", "B", [1], ttl)
    assert b == {1: a[1] + 1}
    async with conn.transaction():
        assert await SQL.leases.fence(conn, "p", "A", a) == [1]
    assert sorted(await SQL.leases.renew_leases(conn, "p", "A", ttl)) == [0, 2]
    await SQL.leases.release_leases(conn, "p", "A", None)
    assert await SQL.leases.renew_leases(conn, "p", "A", ttl) == {}


async def test_offset_rows_stored_behind_the_lease_check_in_one_statement(dsn: str, conn: asyncpg.Connection) -> None:
    """A batch's offset rows and its lease fence are one statement: it locks the fenced leases
    until the transaction ends (a takeover waits), and stores nothing once a slice moved on."""
    ttl = timedelta(seconds=30)
    await SQL.leases.ensure_leases(conn, "p", 1024)
    a = await SQL.leases.acquire_leases(conn, "p", "A", [0, 1, 2], ttl)
    rows = [OffsetRow(0, "x", 1, T0), OffsetRow(1, "y", 1, T0)]
    other = await asyncpg.connect(dsn)
    try:
        await other.execute("SET lock_timeout = '100ms'")
        take = "UPDATE projection_slice_lease SET epoch = epoch + 1 WHERE projection_name = 'p' AND slice = $1"
        async with conn.transaction():
            fence = LeaseFence("A", {0: a[0], 1: a[1]})
            assert await SQL.save_offsets(conn, "p", "0-2", rows, fence=fence) == []
            with pytest.raises(asyncpg.LockNotAvailableError):
                await other.execute(take, 1)  # a fenced lease: locked until the commit
            await other.execute(take, 2)  # not fenced: free
    finally:
        await other.close()
    assert await SQL.load_pid(conn, "p", 1, "y") == (1, T0)
    await conn.execute("UPDATE projection_slice_lease SET expires_at = now() - interval '1s' WHERE slice = 1")
    assert await SQL.leases.acquire_leases(conn, "p", "B", [1], ttl) == {1: a[1] + 1}
    later = [OffsetRow(0, "x", 2, T0), OffsetRow(1, "y", 2, T0)]
    assert await SQL.save_offsets(conn, "p", "0-2", later, fence=LeaseFence("A", {0: a[0], 1: a[1]})) == [1]
    assert await SQL.load_pid(conn, "p", 0, "x") == (1, T0)  # nothing of the batch stored


async def test_pause_resume_reset_clear(conn: asyncpg.Connection) -> None:
    await SQL.save_offsets(conn, "p", "k", [OffsetRow(5, "a", 2, T0)])
    await management.set_paused(conn, SQL, "p", 0, 511, True)
    assert await SQL.paused_keys(conn, "p") == ["0-511"]
    await SQL.leases.heartbeat_worker(conn, "p", "w1", "h", 1, timedelta(seconds=30), "running", 0, None)
    with pytest.raises(ProjectionError):
        await management.reset(conn, SQL, "p", 0, 1023, T0)  # 512-1023 are not paused
    await management.reset(conn, SQL, "p", 0, 511, T0 + timedelta(hours=1))
    loaded = await SQL.load_offsets(conn, "p", [5], timedelta(minutes=5))
    assert loaded[5][0] == T0 + timedelta(hours=1) and loaded[5][1] == [("", 0, T0 + timedelta(hours=1))]
    assert await management.clear(conn, SQL, "p", 0, 511) == 512
    st = await management.status(conn, SQL, "p")
    assert st.ranges[0].paused and st.ranges[0].offset is None
    await management.set_paused(conn, SQL, "p", 100, 100, False)
    assert await SQL.paused_keys(conn, "p") == []
    # epoch milliseconds, as Akka Projection's management table (migration 0012)
    millis = await conn.fetchval("SELECT max(last_updated) FROM projection_management WHERE projection_name = 'p'")
    assert abs(millis - datetime.now(UTC).timestamp() * 1000) < 60_000
