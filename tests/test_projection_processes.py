"""Worker processes (real subprocesses): SIGKILL mid-batch, lease takeover, live rescale under load."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator

import asyncpg
import pytest
from projection_helpers import spawn_worker, stop

from journal import Journal
from projections.demo.cart import CartWorkload, prepare, verify
from projections.postgres_store import ProjectionSql
from tests.support.waiting import wait_until

SQL = ProjectionSql("public")


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await prepare(c)
    await c.execute("TRUNCATE demo_cart_projected, demo_cart_view")
    yield c
    await c.close()


async def projected(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM demo_cart_projected"))


async def owners(conn: asyncpg.Connection, name: str) -> set[str]:
    return {r["owner"] for r in await SQL.leases.lease_owners(conn, name) if r["live"]}


async def assert_exact(journal: Journal, conn: asyncpg.Connection, et: str, written: int) -> None:
    await wait_until(lambda: _at_least(conn, written), 60, f"{written} projected events")
    v = await verify(journal, conn, et)
    assert (v.written, v.missing, v.duplicates, v.view_mismatches) == (written, 0, 0, 0)


async def _at_least(conn: asyncpg.Connection, n: int) -> bool:
    return await projected(conn) >= n


async def test_sigkill_mid_batch_then_restart_and_lease_takeover(
    journal: Journal, conn: asyncpg.Connection, dsn: str
) -> None:
    et, name = "KillCart", "p-kill"
    load = CartWorkload(journal, et, 200, 10, rate=1500)
    task = asyncio.create_task(load.run())
    procs: list[subprocess.Popen[bytes]] = [spawn_worker(dsn, name, et), spawn_worker(dsn, name, et)]
    try:
        await _kill_and_takeover(journal, conn, dsn, name, et, load, task, procs)
    finally:
        stop(procs)


async def _kill_and_takeover(
    journal: Journal, conn: asyncpg.Connection, dsn: str, name: str, et: str, load: CartWorkload,
    task: asyncio.Task[None], procs: list[subprocess.Popen[bytes]],
) -> None:  # fmt: skip
    try:
        await wait_until(lambda: _owned_by(conn, name, 2), 60, "two workers sharing the slices")
        await wait_until(lambda: _at_least(conn, 1000), 30, "projection under way")
        procs[0].send_signal(signal.SIGKILL)  # mid-batch: the batch in flight is rolled back by the server
        procs[0].wait()
        # the survivor takes the dead worker's slices after their leases expire
        await wait_until(lambda: _owned_by(conn, name, 1), 60, "takeover by the survivor")
        procs.append(spawn_worker(dsn, name, et))  # restart: rebalances back to two
        await wait_until(lambda: _owned_by(conn, name, 2), 60, "the restarted worker to get slices")
        n = await projected(conn)
        await wait_until(lambda: _at_least(conn, n + 1), 30, "the two workers to project more events")
    finally:
        load.stop()
        await task
    await assert_exact(journal, conn, et, load.written)


async def _owned_by(conn: asyncpg.Connection, name: str, n: int) -> bool:
    return len(await owners(conn, name)) == n and all(r["live"] for r in await SQL.leases.lease_owners(conn, name))


@pytest.mark.slow
async def test_live_rescale_1_4_8_2_under_write_load(journal: Journal, conn: asyncpg.Connection, dsn: str) -> None:
    et, name = "ScaleCart", "p-scale"
    load = CartWorkload(journal, et, 300, 10, rate=1000)
    task = asyncio.create_task(load.run())
    procs = [spawn_worker(dsn, name, et)]
    try:
        await _rescale(journal, conn, name, et, dsn, load, task, procs)
    finally:
        stop(procs)


async def _rescale(
    journal: Journal, conn: asyncpg.Connection, name: str, et: str, dsn: str, load: CartWorkload,
    task: asyncio.Task[None], procs: list[subprocess.Popen[bytes]],
) -> None:  # fmt: skip
    try:
        for target in (1, 4, 8, 2):
            live = [p for p in procs if p.poll() is None]
            for _ in range(target - len(live)):
                procs.append(spawn_worker(dsn, name, et))
            for p in live[target:]:
                p.send_signal(signal.SIGTERM)  # graceful: commit the batch, release leases
            await wait_until(lambda t=target: _owned_by(conn, name, t), 60, f"{target} workers owning slices")
            written = load.written  # everything written so far gets projected by this configuration
            await wait_until(lambda w=written: _at_least(conn, w), 60, f"catching up with {target} workers")
    finally:
        load.stop()
        await task
    await assert_exact(journal, conn, et, load.written)
